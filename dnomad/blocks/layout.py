"""How an n x n matrix is cut into b x b blocks, and which of them are stored."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class BlockLayout:
    """Square tiling of an n x n matrix by blocks of side ``block_size``.

    The last block row/column is shorter when ``block_size`` does not divide ``n``.
    A symmetric layout stores only the blocks (i, j) with i <= j; every pass
    accounts for the mirrored block (i.e. a stored off-diagonal block counts twice
    in sums, and contributes to both block rows of a product).
    """

    n: int
    block_size: int
    symmetric: bool = True

    @cached_property
    def nblocks(self) -> int:
        return -(-self.n // self.block_size)

    def bounds(self, i: int) -> tuple[int, int]:
        start = i * self.block_size
        return start, min(start + self.block_size, self.n)

    def size(self, i: int) -> int:
        start, stop = self.bounds(i)
        return stop - start

    @cached_property
    def keys(self) -> tuple[tuple[int, int], ...]:
        nb = self.nblocks
        if self.symmetric:
            return tuple((i, j) for i in range(nb) for j in range(i, nb))
        return tuple((i, j) for i in range(nb) for j in range(nb))

    @cached_property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self.size(i) for i in range(self.nblocks))

    def block_shape(self, key: tuple[int, int]) -> tuple[int, int]:
        return self.size(key[0]), self.size(key[1])

    def stored_elements(self) -> int:
        return sum(self.size(i) * self.size(j) for i, j in self.keys)
