"""The one thing ps's servers do for ``ps.torch``: sum a named tensor over every worker (or a
process set's members).

A name is a key (with its shape and dtype: ``collective.tensor_key``). Its first use declares
the key, and a check that every worker asked for the same goes beside the first push
(ps/collective/job.py); each call is one pushpull: the servers sum the workers' tensors and send
the sum back (no optimizer runs there). Every collective of ``ops`` and ``gather`` is made of
these sums.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numpy as np
import torch

from .. import collective
from ..collective import Average, ReduceOp, ops, tensor_key
from ..errors import PSError
from . import runtime
from .compression import Compression
from .process_sets import Scope, scope


_WIRE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int16, torch.int32, torch.int64, torch.uint8,
                torch.int8}


class UnsupportedError(NotImplementedError, ValueError):
    """What ps.torch does not do. A RuntimeError, as Horovod's refusals are, and a ValueError."""


def reduce_op(op: Any, average: bool | None = None) -> ReduceOp:
    return collective.reduce_op(op, average, UnsupportedError, "ps.torch")


def as_array(tensor: torch.Tensor, what: str) -> np.ndarray:
    """The tensor's memory as a numpy array (a view where it can be), or a clear error. Bool
    travels as uint8, bfloat16 (which numpy lacks) as float32."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: tensor on device {tensor.device} is not supported: ps.torch moves CPU "
                         "tensors (copy it with .cpu() first)")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported here (sparse_allreduce_async, or "
                         "DistributedOptimizer, takes them)")
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    elif tensor.dtype == torch.bfloat16:
        tensor = tensor.to(torch.float32)
    if tensor.dtype not in _WIRE_DTYPES:
        raise TypeError(f"{what}: dtype {tensor.dtype} is not supported (float16/32/64, bfloat16, int8/16/32/64, "
                        "uint8, bool)")
    return tensor.detach().contiguous().numpy().reshape(-1)


def scaled(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``ops.scaled`` of a tensor: ``tensor * factor`` in its dtype, Horovod's rule. torch
    multiplies, not numpy, whose float16 casts take four times as long (on a gradient)."""
    if factor == 1.0 or tensor.dtype == torch.bool:
        return tensor
    return (tensor.to(_work_dtype(tensor.dtype)) * factor).to(tensor.dtype)


@functools.cache
def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """``ops.work_dtype`` in torch's terms; bfloat16, which numpy lacks, as the other half float."""
    like = torch.float16 if dtype == torch.bfloat16 else dtype
    try:
        return torch.from_numpy(np.empty(0, ops.work_dtype(torch.empty(0, dtype=like).numpy().dtype))).dtype
    except TypeError:       # another dtype numpy lacks (float8, ...): as_array refuses it by name
        return dtype


def ensure_keys(items: list[tuple[str, tuple[int, ...], np.dtype]], where: Scope | None = None,
                joinable: bool = False, placement: dict[str, int] | None = None) -> Callable[[], None]:
    """Make the keys not seen yet; returns what checks that every worker (of ``where``) asked
    for the same ones: call it before using a result (ps/collective/job.py). ``joinable``: sums
    that go on while workers are in ``hvd.join()``, their share zero. ``placement``: a server
    for some of them (ps.keys.balance), the same on every worker."""
    runtime.store()
    if runtime.server_optimizer:
        raise RuntimeError("a ServerOptimizer runs on the servers of this job, and they update every key they "
                           "hold: allreduce and broadcast of new tensors are not available after it is created")
    return runtime.job.ensure_keys(items, where.group if where is not None else 0, joinable, placement)


# -- names in flight ---------------------------------------------------------------------
class InFlight:
    """The operations of each name still in flight. Held strongly: a script may drop the
    handle of an ``allreduce_async`` it never synchronizes, and the name stays taken until
    the operation is done, as in Horovod. Done entries go at the next sweep (names with a
    step number in them must not pile up), swept when the table has doubled since the last."""

    def __init__(self) -> None:
        self.ops: dict[tuple[str, str], tuple[Any, float]] = {}    # -> (handle, when it started)
        self.sweep_at = 64

    def busy(self, key: tuple[str, str]) -> bool:
        """In flight: not done, or done within a ``CYCLE`` of its start and not synchronized
        (Horovod's call cannot end before its background cycle; ps's may end before the
        script's next line, and a script may count on the name being taken then)."""
        held = self.ops.get(key)
        if held is None:
            return False
        handle, started = held
        return not handle.done() or (not waited(handle) and time.monotonic() - started < CYCLE)

    def add(self, key: tuple[str, str], handle: Any) -> None:
        self.ops[key] = (handle, time.monotonic())
        if len(self.ops) >= self.sweep_at:
            for done in [k for k, (h, _) in self.ops.items() if h.done()]:
                del self.ops[done]
            self.sweep_at = max(64, 2 * len(self.ops))


_inflight = InFlight()
CYCLE = 0.01        # s an unsynchronized call's name stays taken at least (Horovod's cycle is 1-5 ms)


def waited(handle: Any) -> bool:
    """The script has its result (``synchronize``, or a blocking call's own wait)."""
    return bool(getattr(handle, "waited", True))


def claim(kind: str, name: str | None) -> None:
    """Horovod refuses a second operation of a name while the first is still in flight (its
    workers could not tell the two apart); so does ps, before anything is sent."""
    if name is not None and _inflight.busy((kind, name)):
        raise ValueError(f"{kind} of {name!r}: an operation of that name is still in flight (synchronize it "
                         "first, or give this one another name)")


def hold(kind: str, name: str | None, handle: Any) -> Any:
    """Remember ``handle`` as the operation of ``name`` in flight (``claim``); returns it."""
    if name is not None:
        _inflight.add((kind, name), handle)
    return handle


class Handle:
    """What ``allreduce_async`` returns; ``synchronize(handle)`` gives the result.

    ``checks`` run first, before the sum is waited for or anything written: that every
    worker asked for the same new keys (a mismatch would leave the sum's round open for
    good), and a broadcast's check that every worker named the same root. They raise on
    every worker alike."""

    def __init__(self, pending: Any, result: np.ndarray, out: torch.Tensor, scale: float,
                 compression: Any = Compression.none, ctx: Any = None, target: torch.Tensor | None = None,
                 checks: tuple[Callable[[], None], ...] = (), group: int = 0):
        self._pending, self._result, self._out, self._scale = pending, result, out, scale
        self._group = group                 # the process set whose workers' checks these are
        self._compression, self._ctx, self._target, self._checks = compression, ctx, target, checks
        self._value: torch.Tensor | None = None

    def done(self) -> bool:
        return self._value is not None or self._pending is None or self._pending.done

    @property
    def waited(self) -> bool:
        return self._value is not None

    def abandon(self, exc: PSError) -> None:
        """Stop waiting for the sum (``ps.Handle.abandon``): a grouped call's other member
        failed its check, so this one's round may never close either."""
        if self._pending is not None and self._value is None:
            self._pending.abandon(exc)

    def when_summed(self, fn: Callable[[np.ndarray | None], None]) -> None:
        """Call ``fn(sum)`` with the raw sum (unscaled, unchecked: a first step, such as a
        gather's sizes, that must not wait for the caller) once the replies are in, usually
        on the I/O thread; at once when running alone; ``fn(None)`` if the sum failed (then
        ``wait()`` raises why). ``wait()`` still runs the checks."""
        if self._pending is None:
            fn(self._result)
            return

        def done(pending: Any) -> None:
            try:
                pending.wait()
            except PSError:
                fn(None)
                return
            fn(self._result)
        self._pending.add_done_callback(done)

    def wait(self) -> torch.Tensor:
        if self._value is None:
            collective.verified(self._checks, [self], runtime.job, self._group)
            if self._pending is not None:
                self._pending.wait()
            # scaled in the wire's dtype (a bfloat16 sum arrives as float32), then cast
            self._out.copy_(scaled(torch.from_numpy(self._result).view(self._out.shape), self._scale))
            value = self._compression.decompress(self._out, self._ctx)
            if self._target is not None:
                self._target.copy_(value)
            self._value = value
        return self._value


def sum_async(tensor: torch.Tensor, name: str | None, reduce: ReduceOp, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression: Any = Compression.none,
              target: torch.Tensor | None = None, checks: tuple[Callable[[], None], ...] = (),
              where: Scope | None = None, joinable: bool = False, variant: str = "") -> Handle:
    """Start summing (``Average``: averaging) ``tensor`` over every worker (of ``where``, a
    process set's Scope): one pushpull. As Horovod's: prescale, compress, sum, average and
    postscale, decompress. ``joinable`` (allreduce): workers in ``hvd.join()`` add zeros.
    ``variant``: how the result is made, in the key (``names.variant``)."""
    sent, ctx = compression.compress(scaled(tensor.detach(), prescale_factor))
    flat = as_array(sent, f"allreduce of {name!r}" if name else "allreduce")
    out = torch.empty_like(sent)
    kv = runtime.store()
    if kv is None:
        return Handle(None, flat, out, postscale_factor, compression, ctx, target, checks)
    # unnamed: one key per shape and dtype, reused call after call (a new key per call would
    # cost a check each time and grow the servers), in the callers' common order
    where = where or scope()
    key = where.key(tensor_key(f"allreduce.{name if name is not None else 'noname'}{variant}", tuple(sent.shape),
                               flat.dtype))
    verify = ensure_keys([(key, tuple(sent.shape), flat.dtype)], where, joinable)
    result = np.empty_like(flat)
    pending = kv.pushpull(key, flat, out=result, block=False)
    scale = postscale_factor / where.size if reduce is Average else postscale_factor
    return Handle(pending, result, out, scale, compression, ctx, target, (verify, *checks), where.group)


def differentiable(tensor: Any) -> bool:
    """Whether a collective on ``tensor`` must go through its autograd function (Horovod's
    collectives are differentiable)."""
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


def member(name: str | None, i: int) -> str:
    """The name of a group's ``i``-th tensor: each is a key of its own, named after the group,
    else after its place (the key adds its shape and dtype)."""
    return f"{name}.{i}" if name is not None else f"noname.group.{i}"


class Group:
    """The handle of a grouped call: ``synchronize`` gives the list of results."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    @property
    def waited(self) -> bool:
        return all(waited(h) for h in self._handles)

    def wait(self) -> list[torch.Tensor]:
        try:
            return [h.wait() for h in self._handles]
        except PSError as exc:
            for h in self._handles:     # the members after the failed one were never waited on
                h.abandon(exc)
            raise
