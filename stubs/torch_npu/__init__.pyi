# Typed stubs for the parts of torch_npu (Ascend NPU) that kvspec calls. Dev-only: not shipped.
from torch_npu import npu as npu

__version__: str
