"""stubs/torch_npu types the torch_npu calls kvspec's NPU backend makes, and nothing more: a misuse of those
calls is an error, and so is a torch_npu call kvspec never makes (the stubs claim nothing about it)."""

import torch
import torch_npu

torch_npu.npu.synchronize(torch.device("npu:0"), blocking=True)  # E: [call-arg] Unexpected keyword argument "blocking"
torch_npu.npu.is_available("npu:0")  # E: [call-arg] Too many arguments for "is_available"
torch_npu.npu.set_device(0)  # E: [attr-defined] Module has no attribute "set_device"
