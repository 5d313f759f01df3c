"""Tensor fusion for ``DistributedOptimizer``: small gradients travel together.

Each sum costs the worker and the servers a request, its reply and their bookkeeping whatever
its size: for ResNet-50's 161 parameters (193 shapes in ps.bench) that per-request work, not
the bytes, is most of a worker's CPU per step. So consecutive small gradients, in the order
backward produces them (last layer first), share one key: a bucket, one pushpull once every
member's gradient is in it. The layout depends only on the parameters' names, shapes and wire
dtypes, so it is the same on every worker, and the servers sum each element as they would have
summed it in its own key: the numbers do not change (Horovod's fusion buffer, DDP's buckets).

Gradients of ``PS_TORCH_FUSION`` bytes or more go on their own (no copy), and end the bucket
being filled, so that a bucket's gradients are produced one after another and it leaves soon
after its first; so does a bucket that would hold one gradient.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class Member(NamedTuple):
    """A parameter's place in its bucket: the bucket and the slice of its buffer."""
    bucket: Bucket
    start: int
    size: int


class Pending:
    """The sum of a bucket in one step: what ``DistributedOptimizer`` waits on for each of its
    members. Made when the bucket's first gradient of a step arrives; the pushpull is known
    once the last one has."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self.handle: Any = None

    def wait(self) -> None:
        if self.handle is None:
            b = self.bucket
            raise RuntimeError(f"a fused gradient's bucket was never sent ({b.key!r}: {len(b.params) - b.filled} of "
                               f"its {len(b.params)} gradients were not produced or sent before the wait; "
                               "ps/torch/fusion.py)")
        self.handle.wait()

    @property
    def done(self) -> bool:
        return self.handle is not None and self.handle.done


class Bucket:
    """Consecutive small gradients of one wire dtype in one flat buffer, sent as one key. The
    sum comes back into the same buffer: each member lands from its slice."""

    def __init__(self, key: str, members: list[tuple[torch.Tensor, int]], dtype: np.dtype, priority: int) -> None:
        self.key = key
        self.params = [p for p, _ in members]
        self.size = sum(n for _, n in members)
        self.buffer = np.zeros(self.size, dtype)
        self.priority = priority
        self.filled = 0
        self.pending = Pending(self)

    def put(self, member: Member, flat: np.ndarray) -> np.ndarray:
        """Copy one member's gradient (as it travels) into the buffer; returns the slice its
        sum will land in."""
        if self.filled == 0:
            self.pending = Pending(self)
        view = self.buffer[member.start:member.start + member.size]
        view[...] = flat
        self.filled += 1
        return view

    @property
    def full(self) -> bool:
        return self.filled == len(self.params)

    def sent(self, handle: Any) -> None:
        self.pending.handle = handle
        self.filled = 0


def layout(names: dict[torch.Tensor, str], wires: dict[torch.Tensor, tuple[str, tuple[int, ...], np.dtype]],
           priority: dict[torch.Tensor, int], limit: int, key_of: Any) -> dict[torch.Tensor, Member]:
    """The buckets of the parameters ``names`` holds (in the optimizer's order; filled last
    first): each small gradient's Member. ``wires[p]``: its key, wire shape and dtype;
    ``key_of(name, shape, dtype)``: a bucket's key. Parameters not in the result go on their own."""
    members: dict[torch.Tensor, Member] = {}
    if limit <= 0:
        return members
    run: list[tuple[torch.Tensor, int]] = []
    run_dtype: np.dtype | None = None
    run_bytes = 0

    def close() -> None:
        if len(run) > 1:
            first = names[run[0][0]]
            bucket = Bucket(key_of(f"allreduce.grad.fused.{first}.{len(run)}", (sum(n for _, n in run),), run_dtype),
                            list(run), run_dtype, max(priority[p] for p, _ in run))
            start = 0
            for p, n in run:
                members[p] = Member(bucket, start, n)
                start += n
        run.clear()

    for p in reversed(list(names)):
        _, shape, dtype = wires[p]
        n = int(np.prod(shape))
        nbytes = n * dtype.itemsize
        if nbytes >= limit:       # alone; and the run ends: a bucket's gradients come one after another
            close()
            continue
        if run and (dtype != run_dtype or run_bytes + nbytes > limit):
            close()
        if not run:
            run_dtype, run_bytes = dtype, 0
        run.append((p, n))
        run_bytes += nbytes
    close()
    return members


def buckets(members: dict[torch.Tensor, Member]) -> list[Bucket]:
    """Each bucket once, in the order they fill."""
    seen: dict[int, Bucket] = {}
    for m in members.values():
        seen.setdefault(id(m.bucket), m.bucket)
    return list(seen.values())
