"""The engine: n x n matrices as b x b blocks in process memory, worker memory or Zarr,
and fused passes over them.  Only this package builds task graphs and touches Zarr."""
from .builders import (as_data_matrix, check_dtype, choose_block_size, from_array, from_zarr,
                       gaussian_affinity, gram, new_group, prepare_gram_data, zeros_like_layout)
from .engine import BACKENDS, BlockGroup, PassRecord, single_threaded_blas
from .layout import BlockLayout
from .matrix import BlockMatrix
from .passes import (DataPanels, ZarrColumns, blocked_column_order, clean_epoch, hottopixx_epoch,
                     label_sums, line_search_pass, matmat, nomad_pass, shifted_copy,
                     summary)

__all__ = [
    "BACKENDS", "BlockGroup", "ZarrColumns", "blocked_column_order", "clean_epoch", "hottopixx_epoch", "BlockLayout", "BlockMatrix", "DataPanels", "PassRecord",
    "as_data_matrix", "check_dtype", "choose_block_size", "from_array", "from_zarr",
    "gaussian_affinity", "gram", "label_sums", "line_search_pass", "matmat", "new_group", "nomad_pass", "prepare_gram_data",
    "shifted_copy", "single_threaded_blas", "summary", "zeros_like_layout",
]
