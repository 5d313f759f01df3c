"""A Horovod-style job as both framework adapters (``ps.torch``, ``ps.mxnet``'s Horovod calls)
see it: one numpy ``KVStore`` per process, who this process is, and named sums.

Horovod's collectives have no keys: a tensor is named at the call. Here a name is a key, made
by a collective ``init`` the first time it is used. Every worker must then ask for the same
names with the same shapes in the same order; ``ensure_keys`` checks that first, so a script
whose workers disagree gets an error naming the tensor instead of a sync round that never closes.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any

import numpy as np

from . import selfstart
from .errors import MismatchError
from .kvstore import KVStore

KeySpec = tuple[str, tuple[int, ...], np.dtype]     # a key's name, the caller's shape, its dtype


def tensor_key(name: str, shape: tuple[int, ...], dtype: Any) -> str:
    """The key a named tensor travels under. As in Horovod, a name may come back later with
    another shape or dtype (two models' ``bias``, an optimizer state's ``momentum_buffer`` of
    every parameter); a ps key has one, so the key is the name with its shape and dtype."""
    return f"{name}:{'x'.join(map(str, shape))}:{np.dtype(dtype).str}"


def predivide_factor(value: Any) -> float:
    """Horovod's ``gradient_predivide_factor``, checked: a number above 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {value!r}")
    return float(value)


class Job:
    """This process's place in the job. Without ``DMLC_PS_ROOT_URI`` (and not under a bare
    ``mpirun``/``srun``) it runs alone, size 1, every collective a no-op, as Horovod does
    outside ``horovodrun``, so one script serves both."""

    def __init__(self, api: str):
        self.api = api                     # "ps.torch": named in the error for a missing init()
        self._store: KVStore | None = None
        self._alone = False
        self._keys: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self._probes = itertools.count()

    def init(self, kvstore: str = "dist_sync") -> None:
        """Join the job (idempotent)."""
        if self._store is not None or self._alone:
            return
        selfstart.start()           # under mpirun/srun without ps.launch: make the rendezvous here
        if "DMLC_PS_ROOT_URI" not in os.environ:
            self._alone = True
            return
        self._store = KVStore(kvstore)

    def is_initialized(self) -> bool:
        return self._store is not None or self._alone

    def store(self) -> KVStore | None:
        """The cluster's store, or None when this process runs alone."""
        if not self.is_initialized():
            raise ValueError(f"{self.api}.init() has not been called")
        return self._store

    def rank(self) -> int:
        kv = self.store()
        return 0 if kv is None else kv.rank

    def size(self) -> int:
        kv = self.store()
        return 1 if kv is None else kv.num_workers

    def _hosts(self) -> list[str]:
        kv = self.store()
        return [""] if kv is None else kv.worker_hosts

    def local_rank(self) -> int:
        hosts = self._hosts()
        return hosts[:self.rank()].count(hosts[self.rank()])

    def local_size(self) -> int:
        hosts = self._hosts()
        return hosts.count(hosts[self.rank()])

    def _peers(self) -> list[int]:
        """The ranks with this process's local rank, one per host, in rank order (Horovod's
        cross communicator)."""
        hosts, mine = self._hosts(), self.local_rank()
        return [r for r in range(len(hosts)) if hosts[:r].count(hosts[r]) == mine]

    def cross_rank(self) -> int:
        """Which host this is, counting the hosts that run a worker of this local rank."""
        return self._peers().index(self.rank())

    def cross_size(self) -> int:
        return len(self._peers())

    def is_homogeneous(self) -> bool:
        """Every host runs the same number of workers."""
        hosts = self._hosts()
        return len({hosts.count(h) for h in hosts}) == 1

    def ensure_keys(self, items: list[KeySpec]) -> None:
        """Initialize the keys not seen yet, flat (one collective for all of them), after
        checking that every worker asks for the same names, shapes and dtypes: a mismatch
        raises MismatchError (a ValueError and a RuntimeError) on every worker, naming the
        first differing key."""
        new = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in items if name not in self._keys]
        kv = self._store
        if kv is not None and new:
            self.check_same_everywhere(new)
            kv.init([name for name, _, _ in new], [np.zeros(int(np.prod(shape)), dtype) for _, shape, dtype in new])
        for name, shape, dtype in new:
            self._keys[name] = (shape, dtype)

    def check_same_everywhere(self, items: list[KeySpec]) -> None:
        """Sum each key's fingerprint (and the count) over the workers: equal everywhere iff
        the sum is size x our own (exact in float64: 40-bit fingerprints). A collective."""
        kv = self.store()
        if kv is None:
            return
        probe = f"{self.api}.check.{next(self._probes)}"
        mine = np.array([len(items), fingerprint(repr([(n, s, str(d)) for n, s, d in items]))]
                        + [fingerprint(f"{n}{s}{d}") for n, s, d in items[:64]], np.float64)
        head = f"{probe}.head"
        kv.init(head, np.zeros(2, np.float64))
        total = kv.pushpull(head, mine[:2])
        n = kv.num_workers
        if np.array_equal(total, mine[:2] * n):
            return
        if total[0] != mine[0] * n:
            raise MismatchError(f"rank {kv.rank} asks for {len(items)} new tensors, but the workers disagree on "
                                "how many (every worker must register the same parameters / names in the same order)")
        each = f"{probe}.each"
        kv.init(each, np.zeros(len(mine) - 2, np.float64))
        sums = kv.pushpull(each, mine[2:])
        for (name, shape, dtype), got, own in zip(items, sums, mine[2:]):
            if got != own * n:
                raise MismatchError(f"tensor {_label(name)} differs across workers: rank {kv.rank} has shape "
                                    f"{tuple(shape)} and dtype {dtype}, another worker has a different shape, "
                                    "dtype or order")
        raise MismatchError(f"the {len(items)} tensors of rank {kv.rank} differ from another worker's "
                            "(names, shapes, dtypes or order)")

    def shutdown(self) -> None:
        if self._store is not None:
            self._store.close()
        self._store, self._alone = None, False
        self._keys.clear()


def fingerprint(text: str) -> float:
    """40 bits of a hash of ``text``, exact as a float64 (a sum over the workers stays exact)."""
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=5).digest(), "little"))


def _label(key: str) -> str:
    """A key as the script knows it: ``allreduce.w:3:<f4`` is the allreduce of 'w'."""
    head, _, dtype = key.rpartition(":")
    base, _, shape = head.rpartition(":")
    if base and dtype and all(p.isdigit() for p in shape.split("x") if p):
        key = base
    kind, _, rest = key.partition(".")
    if rest.startswith("grad."):
        return f"{rest[len('grad.'):]!r} (a parameter's gradient)"
    return f"{rest!r} ({kind})"
