"""Horovod's SyncBatchNorm: in training, batch statistics over every worker's batch.

One differentiable Sum-allreduce per call carries the element count and each channel's
sums of ``x - c`` and ``(x - c)**2`` in float64, where ``c`` is the running mean (the same on
every worker, and close to the batch mean once it has run a little): so the variance does
not cancel away.
Autograd through that allreduce gives each worker the gradient of the sum of every
worker's loss, as Horovod's hand-written backward does.
"""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..collective import Sum
from . import runtime
from .ops import allreduce


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm*d`` whose training statistics cover the whole job's batch."""

    def _check_input_dim(self, input: torch.Tensor) -> None:    # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:     # noqa: A002
        self._check_input_dim(input)
        if not self.training or not runtime.is_initialized() or runtime.size() == 1:
            return super().forward(input)
        factor = self.momentum if self.momentum is not None else 0.0
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:                   # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        shift = (self.running_mean if self.running_mean is not None
                 else torch.zeros(input.size(1), dtype=input.dtype)).detach().view(shape)
        centred = (input - shift).double()
        count = torch.tensor([input.numel() // input.size(1)], dtype=torch.float64)
        total = allreduce(torch.cat([count, centred.sum(dims), (centred * centred).sum(dims)]), op=Sum)
        n, c = total[0], input.size(1)
        offset = total[1:1 + c] / n
        var = total[1 + c:] / n - offset * offset
        mean = (shift.view(-1) + offset).to(input.dtype)
        var = var.to(input.dtype)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * n / (n - 1).clamp(min=1), alpha=factor)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
