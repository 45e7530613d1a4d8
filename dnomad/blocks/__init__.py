"""The engine: n x n matrices as b x b blocks in process memory, worker memory or Zarr,
and fused passes over them.  Only this package builds task graphs and touches Zarr."""
from .builders import (as_data_matrix, check_dtype, choose_block_size, from_array, from_zarr,
                       gaussian_affinity, gram, input_metadata, neighbour_distance_table, neighbour_distances,
                       new_group, prepare_gram_data, squared_distances_from, with_known_chunks,
                       zeros_like_layout)
from .columns import (FeatureColumns, SparseColumns, ZarrColumns, blocked_column_order, default_row_block,
                      feature_columns, map_column_blocks, stream_rows)
from . import device
from .engine import BACKENDS, BlockGroup, PassRecord, single_threaded_blas
from .layout import BlockLayout
from .matrix import BlockMatrix, available_memory
from .rows import HeldRows, RowChunks, RowState
from .passes import DataPanels, dense, label_sums, matmat, shifted_copy, summary

__all__ = [
    "BACKENDS", "BlockGroup", "BlockLayout", "BlockMatrix", "DataPanels", "FeatureColumns", "HeldRows",
    "PassRecord", "RowChunks", "RowState", "SparseColumns", "ZarrColumns", "as_data_matrix", "available_memory",
    "blocked_column_order",
    "check_dtype", "choose_block_size", "device", "default_row_block", "feature_columns",
    "dense", "from_array", "from_zarr", "gaussian_affinity", "gram", "input_metadata", "label_sums",
    "map_column_blocks", "matmat", "neighbour_distance_table", "neighbour_distances", "new_group",
    "prepare_gram_data", "shifted_copy", "single_threaded_blas", "squared_distances_from", "stream_rows", "summary",
    "with_known_chunks", "zeros_like_layout",
]
