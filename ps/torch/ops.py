"""Collectives on tensors: allreduce and broadcast through the servers' sync rounds.

A name is a key. Its first use is a collective ``init`` (every worker, same order, as every
Horovod collective), after which each call is one pushpull: the servers sum the workers'
tensors and send the sum back (no optimizer runs there). Broadcast is the same sum with
zeros from every rank but the root, so it costs one round trip and needs no other message.
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


class ReduceOp(NamedTuple):
    name: str


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
_OPS = {"average": Average, "sum": Sum}
_WIRE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8}

_keys: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
_unnamed = itertools.count()


def reduce_op(op: Any, average: bool | None = None) -> ReduceOp:
    if op is None:
        return Sum if average is False else Average
    name = op.name if isinstance(op, ReduceOp) else op
    found = _OPS.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"op {op!r} is not supported: ps.torch reduces with ps.torch.Average or ps.torch.Sum "
                         "(no Adasum, Min, Max or Product)")
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


def _fingerprint(text: str) -> float:
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=5).digest(), "little"))


def check_same_everywhere(kv: Any, items: list[tuple[str, tuple[int, ...], np.dtype]]) -> None:
    """Sum each key's fingerprint (and the count) over the workers: equal everywhere iff the
    sum is size x our own (exact in float64: 40-bit fingerprints)."""
    probe = f"ps.torch.check.{next(_unnamed)}"
    mine = np.array([len(items), _fingerprint(repr([(n, s, str(d)) for n, s, d in items]))]
                    + [_fingerprint(f"{n}{s}{d}") for n, s, d in items[:64]], np.float64)
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
                 target: torch.Tensor | None):
        self._pending, self._out, self._result, self._divide, self._target = pending, out, result, divide, target

    def done(self) -> bool:
        return self._pending is None or self._pending.done

    def wait(self) -> torch.Tensor:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            res = torch.from_numpy(self._result).view(self._out.shape)
            if self._divide > 1:          # true division: an integer tensor's mean, then cast back
                res = torch.true_divide(res, self._divide)
            self._out.copy_(res)
            if self._target is not None:
                self._target.copy_(self._out)
        return self._out


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, compression: Any = Compression.none, _target: torch.Tensor | None = None
                    ) -> Handle:
    """Start summing (averaging) ``tensor`` over every worker; ``synchronize`` the handle."""
    reduce = reduce_op(op, average)
    sent = compression.compress(tensor) if isinstance(tensor, torch.Tensor) else tensor
    flat = as_array(sent, f"allreduce of {name!r}" if name else "allreduce")
    # unnamed: one key per shape and dtype, reused call after call (a new key per call would
    # cost a collective init each time and grow the servers), in the callers' common order
    name = f"allreduce.{name}" if name is not None else f"allreduce.noname.{tuple(tensor.shape)}.{flat.dtype}"
    out = torch.empty_like(tensor)
    kv = runtime.store()
    if kv is None:
        out.copy_(tensor)
        if _target is not None:
            _target.copy_(out)
        return Handle(None, out, flat, 1, None)
    ensure_keys([(name, tuple(tensor.shape), flat.dtype)])
    result = np.empty_like(flat)
    pending = kv.pushpull(name, flat, out=result, block=False)
    return Handle(pending, out, result, kv.num_workers if reduce is Average else 1, _target)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
              compression: Any = Compression.none) -> torch.Tensor:
    """The sum (``op=Sum``) or mean (default) of ``tensor`` over every worker, as a new tensor."""
    return allreduce_async(tensor, average, name, op, compression).wait()


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None) -> torch.Tensor:
    return allreduce_async(tensor, average, name, op, _target=tensor).wait()


def synchronize(handle: Handle) -> torch.Tensor:
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.done()


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every worker (a new tensor)."""
    _check_root(root_rank)
    send = tensor if runtime.rank() == root_rank else torch.zeros_like(tensor)
    key = f"broadcast.{name}" if name is not None else None
    return allreduce_async(send, name=key, op=Sum).wait()


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


__all__ = ["Average", "Sum", "ReduceOp", "allreduce", "allreduce_", "allreduce_async", "broadcast",
           "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "poll", "synchronize"]
