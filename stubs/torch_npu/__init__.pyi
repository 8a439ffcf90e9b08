# Typed stubs for the torch_npu (Ascend NPU) calls kvspec makes, and nothing more: kvspec's NPU backend
# (kvspec/device/backends.py) is checked against them by every checker (mypy_path, pyright's stubPath,
# pyrefly's search-path, ty's extra-paths). Dev only: not shipped. Checked against torch_npu's own
# sources by `nox -s typecheckers` (tests/typing/checkers.py, --npu-wheel).
from torch_npu import npu as npu
