"""Horovod's gradient compression: what travels, and how it comes back."""
from __future__ import annotations

import torch


class NoneCompressor:
    """Send the tensor as it is."""

    wire_dtype: torch.dtype | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class FP16Compressor:
    """Send floating-point tensors as float16 (the servers sum in float16, as Horovod's
    allreduce of the compressed tensor does); half the bytes each way."""

    wire_dtype: torch.dtype | None = torch.float16

    @staticmethod
    def compress(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(torch.float16) if tensor.is_floating_point() else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
