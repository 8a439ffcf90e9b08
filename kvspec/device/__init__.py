"""The worker side: block tables, slot mapping and KV cache tensors on CPU, CUDA or Ascend NPU."""

from kvspec.device.backends import DeviceBackend as DeviceBackend
from kvspec.device.backends import get_backend as get_backend
from kvspec.device.block_table import PAD_SLOT_ID as PAD_SLOT_ID
from kvspec.device.block_table import BlockTable as BlockTable
from kvspec.device.block_table import MultiGroupBlockTable as MultiGroupBlockTable
from kvspec.device.block_table import map_to_kernel_blocks as map_to_kernel_blocks
from kvspec.device.block_table import query_start_loc_to_req_indices as query_start_loc_to_req_indices
from kvspec.device.kv_cache import (
    allocate_kv_caches as allocate_kv_caches,
)
from kvspec.device.kv_cache import (
    gather_kv as gather_kv,
)
from kvspec.device.kv_cache import (
    layer_specs_of as layer_specs_of,
)
from kvspec.device.kv_cache import (
    write_kv as write_kv,
)
