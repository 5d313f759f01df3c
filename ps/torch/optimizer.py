"""Horovod's DistributedOptimizer: each gradient leaves for the servers the moment autograd
has accumulated it (last layer first), and ``step()`` waits only for what is in flight.

The wrapped optimizer keeps its state and hyper-parameters (the wrapper is an instance of a
subclass of its class, sharing its attributes, as Horovod's is); only ``step`` and
``zero_grad`` change, plus ``synchronize`` and ``skip_synchronize``.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import numpy as np
import torch

from ..collective import predivide_factor
from . import runtime
from .compression import Compression
from .sums import Average, Sum, as_array, ensure_keys, reduce_op


class _Distributed:
    """Mixed in before the wrapped optimizer's own class (see DistributedOptimizer)."""

    def _ps_setup(self, named_parameters: Any, op: Any, compression: Any, passes: int,
                  predivide: float = 1.0) -> None:
        if not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}")
        self._ps_op = reduce_op(op)
        if self._ps_op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer(op={self._ps_op.name}) is not supported: gradients are "
                             "averaged (hvd.Average) or summed (hvd.Sum)")
        predivide = predivide_factor(predivide)
        if predivide != 1.0 and self._ps_op is not Average:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average (as in Horovod)")
        # Horovod's split of the average: 1/f before the sum, f/size after (keeps fp16 sums in range)
        self._ps_predivide = predivide
        self._ps_compression = compression
        self._ps_passes = passes
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            names = {p: f"param.{i}" for i, p in enumerate(params)}
        else:
            pairs = list(named_parameters)
            seen: dict[str, int] = {}
            for name, _ in pairs:
                seen[name] = seen.get(name, 0) + 1
            dup = sorted(n for n, c in seen.items() if c > 1)
            if dup:
                raise ValueError(f"named_parameters has duplicate names: {dup[:5]}")
            names = {p: name for name, p in pairs}
            missing = [i for i, p in enumerate(params) if p not in names]
            if missing:
                raise ValueError(f"named_parameters does not name {len(missing)} of the optimizer's parameters "
                                 f"(indices {missing[:5]} in its param_groups); pass model.named_parameters() "
                                 "of the model the optimizer trains")
        self._ps_names = {p: names[p] for p in params if p.requires_grad}
        self._ps_counts = {p: 0 for p in self._ps_names}
        # MXNet's rule: the first layer's sum is needed first (next forward), so it overtakes
        # the later layers' under PS_SEND_WINDOW although its gradient is ready last
        self._ps_priority = {p: -i for i, p in enumerate(self._ps_names)}
        self._ps_inflight: dict[torch.Tensor, tuple[Any, np.ndarray]] = {}
        self._ps_synchronized = False
        self._ps_skip = False
        self.timeline: list[tuple[str, float]] = []    # (name, time.perf_counter()) of each send
        arrays = {p: as_array(p.detach(), f"parameter {name!r}") for p, name in self._ps_names.items()}
        self._ps_kv = runtime.store()
        half = compression.wire_dtype is torch.float16
        ensure_keys([(self._ps_key(p), tuple(p.shape),
                      np.dtype("float16") if half and p.is_floating_point() else arrays[p].dtype)
                     for p in self._ps_names])
        self._ps_hooks = [p.register_post_accumulate_grad_hook(self._ps_ready) for p in self._ps_names]

    def _ps_key(self, p: torch.Tensor) -> str:
        return f"allreduce.grad.{self._ps_names[p]}"

    def _ps_ready(self, p: torch.Tensor) -> None:
        """Autograd accumulated ``p.grad``: send it now if this was the last pass of the step."""
        if p in self._ps_inflight:
            raise RuntimeError(f"the gradient of {self._ps_names[p]!r} was computed again before step(): "
                               f"call optimizer.step() (or synchronize()) after every {self._ps_passes} "
                               "backward pass(es), or raise backward_passes_per_step")
        self._ps_counts[p] += 1
        if self._ps_counts[p] == self._ps_passes:
            self._ps_send(p)

    def _ps_send(self, p: torch.Tensor) -> None:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if self._ps_predivide != 1.0:      # in place: the average comes back into p.grad anyway
            with torch.no_grad():
                p.grad.div_(self._ps_predivide)
        grad = self._ps_compression.compress(p.grad)
        flat = as_array(grad, f"gradient of {self._ps_names[p]!r}")
        self.timeline.append((self._ps_names[p], time.perf_counter()))
        if self._ps_kv is None:
            self._ps_inflight[p] = (None, flat)
            return
        # the sum comes back into the gradient's own memory when ``flat`` is a view of it: a
        # server answers a slice only after it has every worker's push of that slice, so
        # nothing still reads those bytes (a resending van copies its payloads anyway)
        result = flat if np.shares_memory(flat, grad.numpy()) else np.empty_like(flat)
        self._ps_inflight[p] = (self._ps_kv.pushpull(self._ps_key(p), flat, out=result, block=False,
                                                     priority=self._ps_priority[p]), result)

    def synchronize(self) -> None:
        """Wait for every gradient's sum; gradients that no backward pass produced on this
        worker (unused layers) go out now as zeros, as the other workers wait for them."""
        for p in self._ps_names:
            if p not in self._ps_inflight:
                self._ps_send(p)
        divide = runtime.size() if self._ps_op is Average else 1
        for p, (handle, result) in list(self._ps_inflight.items()):
            if handle is not None:
                handle.wait()
            summed = torch.from_numpy(result).view(p.shape)
            with torch.no_grad():
                if summed.data_ptr() != p.grad.data_ptr():
                    p.grad.copy_(summed)
                if self._ps_predivide != 1.0:
                    p.grad.mul_(self._ps_predivide / divide)
                elif divide > 1:
                    p.grad.div_(divide)
        self._ps_inflight.clear()
        for p in self._ps_counts:
            self._ps_counts[p] = 0
        self._ps_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside it does not synchronize (call ``synchronize()`` yourself first,
        e.g. to clip the averaged gradients)."""
        self._ps_skip = True
        try:
            yield
        finally:
            self._ps_skip = False

    def step(self, closure: Any = None) -> Any:
        if not self._ps_skip and not self._ps_synchronized:
            self.synchronize()
        self._ps_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._ps_inflight:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but before "
                               "optimizer.step() or optimizer.synchronize(): the gradients are still being summed")
        super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so its gradients are averaged (``op=Sum``: summed) over every worker
    before each step. Collective: every worker calls it with the same parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not runtime.is_initialized():
        raise ValueError("call ps.torch.init() before DistributedOptimizer")
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
    wrapped = base.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)        # same param_groups, state, defaults
    wrapped._ps_setup(named_parameters, op, compression, backward_passes_per_step, gradient_predivide_factor)
    return wrapped
