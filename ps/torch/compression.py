"""Horovod's gradient compression: what travels, and how it comes back.

The interface is Horovod's, so a script's own compressor works unchanged:
``compress(tensor) -> (compressed, ctx)`` before the sum, ``decompress(summed, ctx)`` after.
"""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Subclass this (as in Horovod) for a compressor of your own."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send the tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (the servers sum in float16, as Horovod's
    allreduce of the compressed tensor does); half the bytes each way."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.is_floating_point():
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
