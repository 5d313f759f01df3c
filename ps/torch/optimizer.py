"""Horovod's DistributedOptimizer: each gradient leaves for the servers the moment autograd
has accumulated it (last layer first; small ones together, once their bucket is full:
ps/torch/fusion.py), and ``step()`` waits only for what is in flight.

The wrapped optimizer keeps its state and hyper-parameters (the wrapper is an instance of a
subclass of its class, sharing its attributes, as Horovod's is); only ``step`` and
``zero_grad`` change, plus ``synchronize`` and ``skip_synchronize``.
"""
from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import torch

from .. import keys as keys_mod
from ..collective import Average, Sum, predivide_factor, tensor_key
from . import fusion, runtime
from .compression import Compression
from .cross_barrier import CrossBarrier
from .gather import sparse_allreduce_async
from .process_sets import Scope, outside, scope
from .sums import as_array, ensure_keys, reduce_op, scaled

# per store, the gradient keys its DistributedOptimizers placed and the elements each server
# holds of them: a second optimizer (a GAN's) starts where the first left off, not on the
# servers it filled. Every worker makes the same optimizers in the same order, so all agree.
_PLACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Sent(NamedTuple):
    """A gradient on its way: the pushpull, where its sum lands, and how to undo the wire form."""
    handle: Any                 # the pushpull's handle, or its bucket's fusion.Pending
    result: np.ndarray          # the sum, as it travels (a view of the gradient, or of its bucket, where it can be)
    wire: torch.Tensor          # the compressed gradient that was sent
    ctx: Any                    # the compressor's context for decompress


class _Distributed:
    """Mixed in before the wrapped optimizer's own class (see DistributedOptimizer)."""

    def _ps_setup(self, named_parameters: Any, op: Any, compression: Any, passes: int,
                  predivide: float = 1.0, sparse_as_dense: bool = False, where: Scope | None = None,
                  alone: bool = False, model: torch.nn.Module | None = None) -> None:
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
        self._ps_sparse_as_dense = bool(sparse_as_dense)
        names = _names(self.param_groups, named_parameters)
        self._parameter_names = names                   # Horovod's attribute: {parameter: name}
        self._ps_names = {p: n for p, n in names.items() if p.requires_grad}
        self._ps_counts = {p: 0 for p in self._ps_names}
        # MXNet's rule: the first layer's sum is needed first (next forward), so it overtakes
        # the later layers' under PS_SEND_WINDOW although its gradient is ready last
        self._ps_priority = {p: -i for i, p in enumerate(self._ps_names)}
        self._ps_inflight: dict[torch.Tensor, _Sent] = {}
        self._ps_landing: dict[torch.Tensor, _Sent] = {}     # sent by a step() whose updates wait (model=)
        self._ps_cross: CrossBarrier | None = None
        # sparse gradients, summed at synchronize(), in order: a dict, since a tensor's `in`
        # on a list compares values (elementwise) once two differ in identity
        self._ps_sparse: dict[torch.Tensor, None] = {}
        self._ps_synchronized = False
        self._ps_skip = False
        # (name, time.perf_counter()) of each send of the current (else the last) step: a
        # record of every send would grow by a tuple per parameter per step for good
        self.timeline: list[tuple[str, float]] = []
        self._ps_new_step = True                 # the next send starts a step's timeline
        self._ps_kv = runtime.store()
        self._ps_where = where or scope()        # the process set whose workers share the gradients
        self._ps_alone = alone                   # not in that set: trains on its own gradients (Horovod)
        self._ps_keys = {}
        self._ps_fused: dict[torch.Tensor, fusion.Member] = {}
        if alone:
            self._ps_hooks = []
            return
        if model is not None:
            self._ps_cross = CrossBarrier(model, self._ps_names, self, self._ps_land_all, self._ps_update,
                                          self._ps_arrived)
        for p, name in self._ps_names.items():
            # the key is the gradient as it travels: a compressor may change its dtype or shape
            wire, _ = compression.compress(torch.zeros_like(p.detach()))
            flat = as_array(wire, f"parameter {name!r}")
            self._ps_keys[p] = (self._ps_where.key(tensor_key(f"allreduce.grad.{name}", tuple(wire.shape),
                                                              flat.dtype)),
                                tuple(wire.shape), flat.dtype)
        # over every worker, small gradients share a key (PS_TORCH_FUSION) and the keys are
        # placed by size; a process set's keep a key each, placed by hash
        everyone = self._ps_kv is not None and not self._ps_where.group
        limit = self._ps_kv.config.torch_fusion if everyone else 0
        self._ps_fused = fusion.layout(self._ps_names, self._ps_keys, self._ps_priority, limit,
                                       lambda name, shape, dtype: self._ps_where.key(tensor_key(name, shape, dtype)))
        keys = [self._ps_keys[p] for p in self._ps_names if p not in self._ps_fused]
        if self._ps_fused:
            # every parameter checked first, so a disagreement names the parameter, not a bucket
            runtime.job.check_same_everywhere(list(self._ps_keys.values()))
            keys += [(b.key, (b.size,), b.buffer.dtype) for b in fusion.buckets(self._ps_fused)]
        placement, placed = _place(self._ps_kv, keys) if everyone else (None, None)
        ensure_keys(keys, self._ps_where, joinable=True, placement=placement)()     # every worker has them
        if placed is not None:
            placed()            # only keys every worker agreed on count for the next optimizer
        self._ps_hooks = [p.register_post_accumulate_grad_hook(self._ps_ready) for p in self._ps_names]

    def _ps_ready(self, p: torch.Tensor) -> None:
        """Autograd accumulated ``p.grad``: send it now if this was the last pass of the step."""
        if self._ps_cross is not None:
            self._ps_cross.name_stale(p)
        if p in self._ps_inflight or p in self._ps_sparse:
            raise RuntimeError(f"the gradient of {self._ps_names[p]!r} was computed again before step(): "
                               f"call optimizer.step() (or synchronize()) after every {self._ps_passes} "
                               "backward pass(es), or raise backward_passes_per_step")
        self._ps_counts[p] += 1
        if self._ps_counts[p] == self._ps_passes:
            self._ps_send(p)

    def _ps_send(self, p: torch.Tensor) -> None:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._ps_sparse_as_dense:
                self._ps_sparse[p] = None           # an allgather: made at synchronize(), in order
                member = self._ps_fused.get(p)
                if member is not None:              # its bucket still goes, zeros in its place
                    self._ps_fill(member, np.zeros(member.size, member.bucket.buffer.dtype))
                return
            grad = grad.to_dense()
        if self._ps_predivide != 1.0:      # in place: the average comes back into p.grad anyway
            with torch.no_grad():
                grad.div_(self._ps_predivide)
        wire, ctx = self._ps_compression.compress(grad)
        flat = as_array(wire, f"gradient of {self._ps_names[p]!r}")
        if self._ps_new_step:
            self.timeline.clear()
            self._ps_new_step = False
        self.timeline.append((self._ps_names[p], time.perf_counter()))
        if self._ps_kv is None:
            self._ps_inflight[p] = _Sent(None, flat, wire, ctx)
            return
        member = self._ps_fused.get(p)
        if member is not None:
            result = self._ps_fill(member, flat)       # first: the first gradient of a step starts its Pending
            self._ps_inflight[p] = _Sent(member.bucket.pending, result, wire, ctx)
            return
        # the sum comes back into the gradient's own memory when ``flat`` is a view of it: a
        # server answers a slice only after it has every worker's push of that slice, so
        # nothing still reads those bytes (a resending van copies its payloads anyway)
        result = flat if np.shares_memory(flat, wire.numpy()) else np.empty_like(flat)
        key = self._ps_keys[p][0]
        self._ps_inflight[p] = _Sent(self._ps_kv.pushpull(key, flat, out=result, block=False,
                                                          priority=self._ps_priority[p]), result, wire, ctx)

    def _ps_fill(self, member: fusion.Member, flat: np.ndarray) -> np.ndarray:
        """Put a gradient into its bucket, which leaves once it holds all of its members';
        returns where the gradient's sum will be."""
        bucket = member.bucket
        view = bucket.put(member, flat)
        if bucket.full:
            bucket.sent(self._ps_kv.pushpull(bucket.key, bucket.buffer, out=bucket.buffer, block=False,
                                             priority=bucket.priority))
        return view

    def synchronize(self) -> None:
        """Wait for every gradient's sum; gradients that no backward pass produced on this
        worker (unused layers) go out now as zeros, as the other workers wait for them."""
        if self._ps_alone:
            self._ps_synchronized = True
            return
        self.finish_updates()
        self._ps_send_unsent()
        for p, sent in list(self._ps_inflight.items()):
            self._ps_land(p, sent)
        for p in self._ps_sparse:
            summed = sparse_allreduce_async(p.grad, self._ps_names[p], Sum if self._ps_op is Sum else Average,
                                            self._ps_where)()
            with torch.no_grad():
                p.grad.zero_().add_(summed)
        self._ps_inflight.clear()
        self._ps_sparse.clear()
        self._ps_new_step_begins()
        self._ps_synchronized = True

    def _ps_new_step_begins(self) -> None:
        for p in self._ps_counts:
            self._ps_counts[p] = 0
        self._ps_new_step = True

    def _ps_send_unsent(self) -> None:
        """Gradients no backward pass produced on this worker (unused layers) go out as zeros:
        the other workers wait for them."""
        for p in self._ps_names:
            if p not in self._ps_inflight and p not in self._ps_sparse:
                self._ps_send(p)

    def _ps_land(self, p: torch.Tensor, sent: _Sent) -> None:
        """Wait for ``p``'s sum and put the average (or sum) into ``p.grad``."""
        if sent.handle is not None:
            sent.handle.wait()
        factor = self._ps_predivide / (self._ps_where.size if self._ps_op is Average else 1)
        summed = torch.from_numpy(sent.result).view(sent.wire.shape)
        with torch.no_grad():
            if summed.dtype in (torch.float32, torch.float64):
                summed = summed.mul_(factor) if factor != 1.0 else summed
            else:
                summed = scaled(summed, factor)
            value = self._ps_compression.decompress(summed.to(sent.wire.dtype), sent.ctx)
            if p.grad.is_sparse:                  # sparse_as_dense: back to the form step() expects
                p.grad.zero_().add_(value.to_sparse())
            elif value.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(value)

    def _ps_arrived(self, p: torch.Tensor) -> bool:
        handle = self._ps_landing[p].handle
        return handle is None or handle.done

    def _ps_land_all(self, params: list[torch.Tensor]) -> None:
        for p in params:
            self._ps_land(p, self._ps_landing.pop(p))

    def _ps_update(self, params: list[torch.Tensor], groups: list[dict]) -> None:
        """The wrapped optimizer's own step on ``params`` alone, with ``groups``' settings."""
        chosen, every = set(params), self.param_groups
        self.param_groups = [{**settings, "params": mine} for settings, group in zip(groups, every)
                             if (mine := [p for p in group["params"] if p in chosen])]
        try:
            super().step()
        finally:
            self.param_groups = every

    def finish_updates(self) -> None:
        """With ``model=``: wait for every sum of the last ``step()`` and apply its updates now
        (before reading the weights outside the model's forward pass)."""
        if self._ps_cross is not None:
            self._ps_cross.finish()

    def state_dict(self) -> dict:
        self.finish_updates()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.finish_updates()
        super().load_state_dict(state_dict)

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
        if (self._ps_cross is not None and closure is None and not self._ps_skip and not self._ps_synchronized
                and not self._ps_sparse):
            self._ps_cross.finish()              # updates of modules the last forward pass did not run
            self._ps_send_unsent()
            sent = sorted(self._ps_inflight, key=self._ps_priority.__getitem__, reverse=True)   # first layers first
            self._ps_landing.update(self._ps_inflight)
            self._ps_inflight.clear()
            self._ps_new_step_begins()
            self._ps_cross.defer(sent, [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups])
            return None
        if not self._ps_skip:
            if self._ps_synchronized:
                # Horovod's warning (Horovod then sums the gradients again; ps has nothing left
                # in flight, so it goes on with the sums it has)
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            else:
                self.synchronize()
        self._ps_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._ps_inflight or self._ps_sparse:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but before "
                               "optimizer.step() or optimizer.synchronize(): the gradients are still being summed")
        if not set_to_none:
            self.finish_updates()                # zeroing in place would erase the sums still to be applied
        super().zero_grad(set_to_none=set_to_none)


def local_step(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's own step, without the sums (which every worker would have to join):
    broadcast_optimizer_state makes a fresh optimizer's state with it."""
    if isinstance(optimizer, _Distributed):
        super(_Distributed, optimizer).step()
    else:
        optimizer.step()


def _names(param_groups: list[dict], named_parameters: Any) -> dict[torch.Tensor, str]:
    """Every parameter's name: ``named_parameters``' (which must name all, once), else
    Horovod's ``allreduce.noname.<group>.<index>``."""
    params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(param_groups)
                for j, p in enumerate(group["params"])}
    pairs = list(named_parameters)
    if any(not (isinstance(e, tuple) and len(e) == 2) for e in pairs):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters()")
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
    return {p: names[p] for p in params}


def _check_groups(num_groups: Any, groups: Any) -> None:
    """Horovod's fusion knobs, checked as Horovod checks them. ps fuses by size
    (PS_TORCH_FUSION, ps/torch/fusion.py), so they change nothing else."""
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 0:
        raise ValueError(f"num_groups should be a non-negative integer, got {num_groups!r}")
    if groups is None:
        return
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so its gradients are averaged (``op=Sum``: summed) over every worker
    before each step. Collective: every worker calls it with the same parameters. Sparse
    gradients (``nn.Embedding(sparse=True)``) are summed as an allgather of their rows, or
    dense with ``sparse_as_dense=True``. With ``process_set``, over its members; a worker
    outside it steps on its own gradients, as under Horovod.

    With ``model`` (ps's cross-barrier, ps/torch/cross_barrier.py): ``step()`` returns once
    every gradient is on its way, and the next forward pass waits, module by module, for the
    sums of that module's parameters and updates them then: communication overlaps the next
    forward pass. Same numbers; see docs/torch.md for what it needs."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not runtime.is_initialized():
        raise ValueError("call ps.torch.init() before DistributedOptimizer")
    alone = outside(process_set)
    where = None if alone else scope(process_set)
    _check_groups(num_groups, groups)
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
    wrapped = base.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)        # same param_groups, state, defaults
    wrapped._ps_setup(named_parameters, op, compression, backward_passes_per_step, gradient_predivide_factor,
                      sparse_as_dense, where, alone, model)
    return wrapped


def _place(kv: Any, keys: list[tuple[Any, tuple[int, ...], Any]]) -> tuple[dict, Callable[[], None]]:
    """A server for each of ``keys`` this store's optimizers have not placed yet, by size,
    after what they placed before (ps.keys.balance); and the call that records them, made once
    the workers agreed on the keys (a disagreement the job goes on from must leave every
    worker's record as it was, or the next optimizer's keys would differ between workers)."""
    seen, held = _PLACED.get(kv, (frozenset(), [0] * kv.num_servers))
    held = list(held)
    new = [(name, int(np.prod(shape))) for name, shape, _ in keys if name not in seen]
    placement = keys_mod.balance(new, kv.num_servers, kv.config.bigarray_bound, held=held)

    def record() -> None:
        _PLACED[kv] = (seen | {name for name, _ in new}, held)
    return placement, record
