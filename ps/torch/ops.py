"""Collectives on tensors: allreduce and broadcast through the servers' sync rounds.

A name is a key. Its first use is a collective ``init`` (every worker, same order, as every
Horovod collective), after which each call is one pushpull: the servers sum the workers'
tensors and send the sum back (no optimizer runs there). Broadcast is the same sum with
zeros from every rank but the root, so it costs one round trip and needs no other message.
Min, Max and Product, which a sum cannot give, reduce an allgather (ps/torch/gather.py).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any, NamedTuple

import numpy as np
import torch

from . import runtime
from .compression import Compression
from .process_sets import check as check_process_set


class ReduceOp(NamedTuple):
    name: str


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
Adasum = ReduceOp("Adasum")
Min = ReduceOp("Min")
Max = ReduceOp("Max")
Product = ReduceOp("Product")
_OPS = {op.name.lower(): op for op in (Average, Sum, Min, Max, Product)}
GATHERED = (Min, Max, Product)        # reduced on the workers, from an allgather
_WIRE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8}

_keys: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
_unnamed = itertools.count()


def reduce_op(op: Any, average: bool | None = None) -> ReduceOp:
    if op is None:
        return Sum if average is False else Average
    name = op.name if isinstance(op, ReduceOp) else op
    found = _OPS.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"op {name if isinstance(name, str) else op!r} is not supported: ps.torch reduces with "
                         "Average, Sum, Min, Max or Product (no Adasum: the servers sum)")
    return found


def as_array(tensor: torch.Tensor, what: str) -> np.ndarray:
    """The tensor's memory as a numpy array (a view where it can be), or a clear error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: tensor on device {tensor.device} is not supported: ps.torch moves CPU "
                         "tensors (copy it with .cpu() first)")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported")
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    if tensor.dtype not in _WIRE_DTYPES:
        raise TypeError(f"{what}: dtype {tensor.dtype} is not supported (float16/32/64, int8/32/64, uint8, bool)")
    return tensor.detach().contiguous().numpy().reshape(-1)


def ensure_keys(items: list[tuple[str, tuple[int, ...], np.dtype]]) -> None:
    """Initialize the keys not seen yet (one collective for all of them), after checking that
    every worker asks for the same names, shapes and dtypes: a mismatch raises ValueError on
    every worker, naming the first differing key, instead of a sync round that never closes."""
    kv = runtime.store()
    if runtime.server_optimizer:
        raise RuntimeError("a ServerOptimizer runs on the servers of this job, and they update every key they "
                           "hold: allreduce and broadcast of new tensors are not available after it is created")
    new = [(name, shape, dtype) for name, shape, dtype in items if name not in _keys]
    if kv is None or not new:
        for name, shape, dtype in new:
            _keys[name] = (shape, dtype)
        return
    check_same_everywhere(kv, new)
    kv.init([name for name, _, _ in new], [np.zeros(int(np.prod(shape)), dtype) for _, shape, dtype in new])
    for name, shape, dtype in new:
        _keys[name] = (shape, dtype)


def fingerprint(text: str) -> float:
    """40 bits of a hash of ``text``, exact as a float64 (a sum over the workers stays exact)."""
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=5).digest(), "little"))


def check_same_everywhere(kv: Any, items: list[tuple[str, tuple[int, ...], np.dtype]]) -> None:
    """Sum each key's fingerprint (and the count) over the workers: equal everywhere iff the
    sum is size x our own (exact in float64: 40-bit fingerprints)."""
    probe = f"ps.torch.check.{next(_unnamed)}"
    mine = np.array([len(items), fingerprint(repr([(n, s, str(d)) for n, s, d in items]))]
                    + [fingerprint(f"{n}{s}{d}") for n, s, d in items[:64]], np.float64)
    head = f"{probe}.head"
    kv.init(head, np.zeros(2, np.float64))
    total = kv.pushpull(head, mine[:2])
    n = kv.num_workers
    if np.array_equal(total, mine[:2] * n):
        return
    if total[0] != mine[0] * n:
        raise ValueError(f"rank {kv.rank} asks for {len(items)} new tensors, but the workers disagree on how "
                         f"many (every worker must register the same parameters / names in the same order)")
    each = f"{probe}.each"
    kv.init(each, np.zeros(len(mine) - 2, np.float64))
    sums = kv.pushpull(each, mine[2:])
    for (name, shape, dtype), got, own in zip(items, sums, mine[2:]):
        if got != own * n:
            raise ValueError(f"tensor {_label(name)} differs across workers: rank {kv.rank} has shape {tuple(shape)} "
                             f"and dtype {dtype}, another worker has a different shape, dtype or order")
    raise ValueError(f"the {len(items)} tensors of rank {kv.rank} differ from another worker's "
                     "(names, shapes, dtypes or order)")


def _label(key: str) -> str:
    kind, _, rest = key.partition(".")
    if rest.startswith("grad."):
        return f"{rest[len('grad.'):]!r} (a parameter's gradient)"
    return f"{rest!r} ({kind})"


class Handle:
    """What ``allreduce_async`` returns; ``synchronize(handle)`` gives the result."""

    def __init__(self, pending: Any, out: torch.Tensor, result: np.ndarray, divide: int,
                 target: torch.Tensor | None, scale: float = 1.0):
        self._pending, self._out, self._result, self._divide, self._target = pending, out, result, divide, target
        self._scale = scale

    def done(self) -> bool:
        return self._pending is None or self._pending.done

    def wait(self) -> torch.Tensor:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            res = torch.from_numpy(self._result).view(self._out.shape)
            if self._divide > 1:          # true division: an integer tensor's mean, then cast back
                res = torch.true_divide(res, self._divide)
            if self._scale != 1.0:
                res = res * self._scale
            self._out.copy_(res)
            if self._target is not None:
                self._target.copy_(self._out)
        return self._out


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None, *, compression: Any = Compression.none,
                    _target: torch.Tensor | None = None) -> Any:
    """Start summing (averaging, ...) ``tensor`` over every worker; ``synchronize`` the handle."""
    check_process_set(process_set)
    reduce = reduce_op(op, average)
    if reduce in GATHERED:
        from .gather import reduce_gathered
        return reduce_gathered(tensor, reduce, name, prescale_factor, postscale_factor, _target)
    if prescale_factor != 1.0:
        tensor = tensor * prescale_factor
    sent = compression.compress(tensor) if isinstance(tensor, torch.Tensor) else tensor
    flat = as_array(sent, f"allreduce of {name!r}" if name else "allreduce")
    # unnamed: one key per shape and dtype, reused call after call (a new key per call would
    # cost a collective init each time and grow the servers), in the callers' common order
    name = f"allreduce.{name}" if name is not None else f"allreduce.noname.{tuple(tensor.shape)}.{flat.dtype}"
    out = torch.empty_like(tensor)
    kv = runtime.store()
    if kv is None:
        out.copy_(tensor * postscale_factor if postscale_factor != 1.0 else tensor)
        if _target is not None:
            _target.copy_(out)
        return Handle(None, out, flat, 1, None)
    ensure_keys([(name, tuple(tensor.shape), flat.dtype)])
    result = np.empty_like(flat)
    pending = kv.pushpull(name, flat, out=result, block=False)
    return Handle(pending, out, result, kv.num_workers if reduce is Average else 1, _target, postscale_factor)


class _Allreduce(torch.autograd.Function):
    """Horovod's allreduce is differentiable: the gradient is the same allreduce of the
    output's gradient (every worker runs backward, as every worker ran forward)."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale, postscale, compression):    # noqa: ANN001
        ctx.args = (average, op, prescale, postscale)
        return allreduce_async(tensor, average, name, op, prescale, postscale, compression=compression).wait()

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        average, op, prescale, postscale = ctx.args
        return (allreduce_async(grad, average, None, op, prescale, postscale).wait(),
                None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """The mean (default), sum, min, max or product of ``tensor`` over every worker, as a new
    tensor; differentiable, as Horovod's."""
    check_process_set(process_set)
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _Allreduce.apply(tensor, average, name, op, prescale_factor, postscale_factor, compression)
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                           compression=compression).wait()


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> Any:
    """``allreduce_async`` whose result is written back into ``tensor`` by ``synchronize``."""
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set, _target=tensor)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set).wait()


class Group:
    """The handle of a grouped call: ``synchronize`` gives the list of results."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self) -> list[torch.Tensor]:
        return [h.wait() for h in self._handles]


def _member(name: str | None, i: int, tensor: torch.Tensor) -> str:
    """A group's tensors are keys of their own: named after the group, else after their place
    and shape (the unnamed rule of one key per shape would put two of them in one key)."""
    return f"{name}.{i}" if name is not None else f"noname.group.{i}.{tuple(tensor.shape)}"


def grouped_allreduce_async(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None, *, compression: Any = Compression.none,
                            _inplace: bool = False) -> Group:
    return Group([allreduce_async(t, average, _member(name, i, t), op, prescale_factor, postscale_factor, process_set,
                                  compression=compression, _target=t if _inplace else None)
                  for i, t in enumerate(tensors)])


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[torch.Tensor]:
    """Every tensor of the list allreduced, all in flight together."""
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                                   compression=compression).wait()


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> Group:
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                                   _inplace=True)


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> list[torch.Tensor]:
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set).wait()


def synchronize(handle: Handle) -> torch.Tensor:
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.done()


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None,
                    _target: torch.Tensor | None = None) -> Handle:
    check_process_set(process_set)
    _check_root(root_rank)
    send = tensor.detach() if runtime.rank() == root_rank else torch.zeros_like(tensor)
    key = f"broadcast.{name}" if name is not None else None
    return allreduce_async(send, name=key, op=Sum, _target=_target)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every worker (a new tensor)."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> Handle:
    """``broadcast_async`` into ``tensor`` itself (at ``synchronize``)."""
    return broadcast_async(tensor, root_rank, name, process_set, _target=tensor)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    with torch.no_grad():
        return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every tensor in ``params`` (a state_dict, or (name, tensor) pairs such as
    ``model.named_parameters()``) with rank ``root_rank``'s, in place; one round trip."""
    items = list(params.items()) if hasattr(params, "items") else list(params)
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ValueError(f"broadcast_parameters takes a state_dict or (name, tensor) pairs, got {entry!r:.80}")
    kv = runtime.store()
    if kv is None:
        return
    _check_root(root_rank)
    flats = [(f"broadcast.{name}", t, as_array(t, f"broadcast of {name!r}"))
             for name, t in items if isinstance(t, torch.Tensor)]
    ensure_keys([(key, tuple(t.shape), flat.dtype) for key, t, flat in flats])
    pending = []
    for key, t, flat in flats:
        send = flat if kv.rank == root_rank else np.zeros_like(flat)
        result = np.empty_like(flat)
        pending.append((t, result, kv.pushpull(key, send, out=result, block=False)))
    for t, result, handle in pending:
        handle.wait()
        with torch.no_grad():
            t.copy_(torch.from_numpy(result).view(t.shape).to(t.dtype))


def _check_root(root_rank: int) -> None:
    size = runtime.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise ValueError(f"root_rank {root_rank!r} is out of range for a job of {size} workers")


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Rank ``root_rank``'s JSON-serializable ``obj`` on every worker. Unlike Horovod's, not a
    pickle: what comes back from the servers is never unpickled (docs/security.md)."""
    if runtime.store() is None:
        return obj
    _check_root(root_rank)
    data = json.dumps(obj).encode() if runtime.rank() == root_rank else b""
    tag = name or f"object.{next(_unnamed)}"
    n = int(broadcast(torch.tensor([len(data)], dtype=torch.int64), root_rank, name=f"{tag}.len").item())
    buf = torch.zeros(n, dtype=torch.uint8)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    got = broadcast(buf, root_rank, name=f"{tag}.data.{n}")
    return json.loads(got.numpy().tobytes().decode())


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Rank ``root_rank``'s optimizer state (momentum buffers, Adam moments and step counts)
    and hyper-parameters on every worker, in place. Every worker must hold the same layout
    of state: a fresh optimizer everywhere is fine (then only hyper-parameters move)."""
    if runtime.store() is None:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    states = [(i, optimizer.state[p]) for i, p in enumerate(params) if p in optimizer.state]
    layout = [[i, sorted([k, list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__]
                         for k, v in st.items())] for i, st in states]
    if broadcast_object(layout, root_rank) != json.loads(json.dumps(layout)):
        raise ValueError(f"rank {runtime.rank()}'s optimizer state differs in layout from rank {root_rank}'s "
                         "(did only some workers load a checkpoint or take a step?)")
    broadcast_parameters([(f"optstate.{i}.{k}", v) for i, st in states for k, v in sorted(st.items())
                          if isinstance(v, torch.Tensor)], root_rank)
    scalars = {f"{i}.{k}": v for i, st in states for k, v in st.items() if not isinstance(v, torch.Tensor)}
    got = broadcast_object(scalars, root_rank)
    for i, st in states:
        for k in list(st):
            if f"{i}.{k}" in got:
                st[k] = got[f"{i}.{k}"]
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for group, theirs in zip(optimizer.param_groups, broadcast_object(hyper, root_rank)):
        for k, v in theirs.items():
            group[k] = tuple(v) if isinstance(group.get(k), tuple) else v


__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "ReduceOp", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
           "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "poll", "synchronize"]
