"""Device backends: what a block table needs to know about the device it feeds.

``get_backend("cuda:1")`` picks the backend from a torch device string. Importing this module never
imports a vendor runtime: ``torch_npu`` is imported only when an NPU backend is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from kvspec.errors import DeviceError


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceBackend:
    """A device and the conventions its kernels expect.

    ``block_id_dtype`` / ``slot_mapping_dtype``: index dtypes of block tables and slot mappings (Ascend's
    ``reshape_and_cache`` needs int32 slots; CUDA kernels take int64). ``pin_memory``: whether host
    staging buffers are pinned so host-to-device copies can be asynchronous. ``alignment_bytes``: the
    allocation alignment the device's allocator guarantees.
    """

    name: str
    device: torch.device
    block_id_dtype: torch.dtype
    slot_mapping_dtype: torch.dtype
    pin_memory: bool
    alignment_bytes: int

    def synchronize(self) -> None:
        if self.name == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.name == "npu":
            _require_torch_npu()
            import torch_npu  # typed by stubs/torch_npu (what kvspec calls, nothing more)

            torch_npu.npu.synchronize(self.device)


def _require_torch_npu() -> None:
    """Import torch_npu (which registers the ``npu`` device with torch), or a DeviceError saying what to
    install. Callers then ``import torch_npu`` themselves: a plain import statement, so that type checkers
    check the calls against stubs/torch_npu."""
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        raise DeviceError(
            "The NPU backend needs torch_npu (Ascend's PyTorch adapter) and CANN; install them to use 'npu'."
        ) from exc


def get_backend(device: str | torch.device = "cpu") -> DeviceBackend:
    """The backend for a torch device string ("cpu", "cuda", "cuda:1", "npu:0")."""
    try:
        dev = torch.device(device) if isinstance(device, str) and not device.startswith("npu") else device
    except RuntimeError:
        raise DeviceError(f"Unknown device {device!r}; use cpu, cuda (cuda:N) or npu (npu:N).") from None
    if isinstance(dev, str):  # "npu..." strings parse only once torch_npu is imported
        _require_torch_npu()
        import torch_npu

        if not torch_npu.npu.is_available():
            raise DeviceError("torch_npu is installed but no Ascend NPU is available.")
        dev = torch.device(dev)
    if dev.type == "cpu":
        return DeviceBackend(
            name="cpu",
            device=dev,
            block_id_dtype=torch.int32,
            slot_mapping_dtype=torch.int64,
            pin_memory=False,
            alignment_bytes=64,
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"Device {dev} was asked for, but CUDA is not available on this machine.")
        return DeviceBackend(
            name="cuda",
            device=dev,
            block_id_dtype=torch.int32,
            slot_mapping_dtype=torch.int64,
            pin_memory=True,
            alignment_bytes=256,
        )
    if dev.type in ("npu", "privateuseone"):
        return DeviceBackend(
            name="npu",
            device=dev,
            block_id_dtype=torch.int32,
            slot_mapping_dtype=torch.int32,
            pin_memory=True,
            alignment_bytes=512,
        )
    raise DeviceError(f"No kvspec device backend for {dev.type!r}; use cpu, cuda or npu.")
