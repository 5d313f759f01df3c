"""``ps.KVStore``: the worker API, numpy in and out, MXNet's semantics.

    kv = ps.KVStore('dist_sync')            # joins the cluster named by the DMLC_* variables
    kv.init(3, np.zeros((1000, 1000), np.float32))
    kv.push(3, grad)                         # returns at once; don't change grad until waited
    w = kv.pull(3)                           # waits for this worker's earlier pushes to key 3

    kv.push(3, ps.RowSparse(rows, values))   # only these rows travel (values: one row each)
    r = kv.row_sparse_pull(3, row_ids)       # RowSparse of those rows, each once, sorted
"""
from __future__ import annotations

import atexit
import functools
import logging
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from . import compression as comp
from . import keys as keys_mod
from ._timing import Deadline
from .config import Config
from .customer import Handle, Request
from .errors import ClosedError, ConfigError, PSError, PSTimeoutError
from .keys import Slice
from .message import Op, Role, dtype_code, namespace_field
from .postoffice import Postoffice
from .van import Van
from .worker import KVWorker

logger = logging.getLogger(__name__)

TYPES = ("dist_sync", "dist_async", "dist_sync_device", "dist_device_sync", "dist_async_device", "dist")
CLOSE_WAIT = 60.0   # seconds close() waits for outstanding requests when PS_REQUEST_TIMEOUT is 0


class Recorder(Protocol):
    """What :meth:`KVStore.record` shows requests on (Horovod's timeline, ``Timeline``): a
    Protocol, so that the core need not import the Horovod layer for a type."""

    def started(self, key: Any) -> Callable[[], None] | None:
        """A request on ``key`` left; what to call when its result is in (None: not shown)."""

    def cycle(self) -> None:
        """Queued requests left together."""


class Joined(NamedTuple):
    """What :meth:`KVStore.join` returns."""

    last: int                   # the rank of the last worker to join
    skipped: dict[int, int]     # server key -> rounds that closed without this worker


@dataclass(frozen=True)
class KeyInfo:
    """What every worker records at init: enough to check and route later calls."""

    name: Any
    key: int
    shape: tuple[int, ...]
    dtype: np.dtype
    dtype_code: int
    slices: tuple[Slice, ...]
    row_len: int = 1          # elements per row (slices hold whole rows)
    label: str = ""           # how messages name it: the caller's key (see init's labels)
    declared: bool = False    # made by its first push (declare), not by init
    joinable: bool = False    # its rounds may close without workers that joined (declare, join)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class RowSparse(NamedTuple):
    """Some rows of a key's value (MXNet's row_sparse): ``values[i]`` is row ``rows[i]``,
    ``values.shape == (len(rows),) + shape[1:]``. A push of one sends only these rows; the
    servers update only them where the optimizer is lazy (MXNet's ``lazy_update``)."""

    rows: np.ndarray
    values: np.ndarray


class KVStore:
    """A worker's connection to the parameter servers.

    Raises ConfigError for a bad environment, PSTimeoutError if the cluster does not
    form within PS_CONNECT_TIMEOUT, PeerLostError when another node dies.
    """

    def __init__(self, type: str = "dist_sync", config: Config | None = None, van: Van | None = None):
        if type not in TYPES:
            raise ValueError(f"unknown kvstore type {type!r}; use one of {', '.join(TYPES)}")
        cfg = config or Config.from_env()
        if not cfg.is_worker:
            raise ConfigError(f"DMLC_ROLE={cfg.role!r}: a KVStore runs on workers; start servers "
                              "and the scheduler with `python -m ps`")
        if cfg.verbose:
            from . import _logging
            _logging.setup(cfg.verbose, "[worker] ")
        self._type = type
        self._sync = "async" not in type
        self._po = Postoffice(cfg, van)
        self._worker = KVWorker(self._po)
        self._keys: dict[Any, KeyInfo] = {}
        self._key_kind: type | None = None
        self._compression: dict[str, Any] | None = None
        self._residuals: dict[int, np.ndarray] = {}
        self._closed = False
        self._round = 0
        self._timeline: Recorder | None = None
        try:
            self._po.start({"sync": self._sync})
            if self._po.restarted:
                self._round = self._rejoin()
                self._po.rejoined()
        except BaseException:
            self._po.close(linger=0)
            raise
        ref = weakref.ref(self)
        self._atexit = lambda: ref() is not None and ref().close()
        atexit.register(self._atexit)

    # -- properties ----------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._type

    @property
    def rank(self) -> int:
        return self._po.rank

    @property
    def num_workers(self) -> int:
        return self._po.num_workers

    @property
    def num_servers(self) -> int:
        return self._po.num_servers

    @property
    def _timeout(self) -> float:
        return self._po.config.request_timeout

    # -- restarts (PS_MAX_RESTARTS) --------------------------------------------------------
    @property
    def restarted(self) -> bool:
        """This worker replaces one that died (``python -m ps.launch --max-restarts``)."""
        return bool(self._po.restarted)

    @property
    def round(self) -> int:
        """A restarted worker: the sync rounds its dead self had completed (every key pushed
        that often), i.e. the step to resume at when each step pushes every key once; 0 otherwise."""
        return self._round

    def _rejoin(self) -> int:
        pushed = self._worker.command("pushed", {"worker": self._po.node_id})
        counts = [n for per_server in pushed.values() for n in (per_server or {}).values()]
        return min(counts, default=0)

    def resume(self) -> int:
        """A restarted worker that jumps to step :attr:`round` itself calls this first: its
        next push to each key then counts as that round's. Without it, a restarted worker
        re-runs its script from the start, and the servers answer the pushes its dead self
        made (with the current values) without applying them again, until it catches up.
        Returns :attr:`round`."""
        self._worker.resume(self._round)
        return self._round

    # -- the adapter surface (ps.mxnet, benchmarks, tests) ---------------------------------
    @property
    def config(self) -> Config:
        return self._po.config

    @property
    def closed(self) -> bool:
        return self._closed

    @staticmethod
    def server_key(key: int | str) -> int:
        """The int key the servers know ``key`` by (a str key is hashed): the index a
        server-side optimizer is called with."""
        return keys_mod.to_int_key(key)

    @property
    def key_kind(self) -> type | None:
        """``int`` or ``str`` once a key is initialized (a store never mixes them)."""
        return self._key_kind

    def key_info(self, key: Any) -> KeyInfo | None:
        """What init recorded for ``key`` (shape, dtype, placement); None if not initialized."""
        return self._keys.get(key)

    @property
    def nodes(self) -> dict[int, Any]:
        """The node table: node id -> the node's role, rank and addresses."""
        return self._po.nodes

    @property
    def server_ids(self) -> list[int]:
        return self._po.server_ids

    @property
    def worker_hosts(self) -> list[str]:
        """Each worker's host (its announced address), by rank: what Horovod's local and
        cross ranks are computed from."""
        hosts = {n.rank: n.host for n in self._po.nodes.values() if n.role == Role.WORKER}
        return [hosts.get(r, "") for r in range(self.num_workers)]

    def call_soon(self, fn: Any) -> None:
        """Run ``fn`` on this worker's I/O thread (an adapter hands work over without waiting)."""
        self._po.call_soon(fn)

    def transport_stats(self) -> dict[str, int]:
        """Counters of the transport: messages dropped on purpose (PS_DROP_MSG), resent,
        credits received (PS_SEND_WINDOW), ..."""
        return {**self._po.transport_stats(), "credits": self._worker.credits}

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ps.KVStore {self._type} rank {self.rank}/{self.num_workers}, {self.num_servers} servers>"

    # -- keys ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this KVStore is closed")
        if self._po.failure is not None:
            raise self._po.failure

    def _info(self, key: Any) -> KeyInfo:
        info = self._keys.get(key)
        if info is None:
            keys_mod.to_int_key(key)    # a key of a wrong type is named as that, not as missing
            raise KeyError(f"key {key!r} is not initialized; call kv.init({key!r}, value) first")
        return info

    def _new_info(self, key: Any, value: np.ndarray, label: str | None = None) -> KeyInfo:
        label = label or repr(key)
        kind = str if isinstance(key, str) else int
        if self._key_kind is not None and kind is not self._key_kind:
            raise TypeError(f"key {label}: one store cannot mix int and str keys")
        if key in self._keys:
            raise ValueError(f"key {label} is already initialized; a key can be initialized only once")
        int_key = keys_mod.to_int_key(key)
        self._key_kind = kind
        row_len = max(1, int(np.prod(value.shape[1:], dtype=np.int64))) if value.ndim >= 2 else 1
        return KeyInfo(key, int_key, tuple(value.shape), value.dtype, dtype_code(value.dtype),
                       keys_mod.plan(int_key, value.size, self.num_servers, self._po.config.bigarray_bound, row_len),
                       row_len, label)

    def _value(self, info: KeyInfo, value: Any, what: str) -> np.ndarray:
        """One contiguous array for ``info``; a list (one per device) is summed first."""
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError(f"{what} key {info.label}: empty list of values")
            arrays = [self._value(info, v, what) for v in value]
            return arrays[0] if len(arrays) == 1 else functools.reduce(np.add, arrays)
        arr = np.asarray(value)
        if arr.shape != info.shape:
            raise ValueError(f"{what} key {info.label}: shape {arr.shape} does not match the "
                             f"initialized shape {info.shape}")
        if arr.dtype != info.dtype:
            raise TypeError(f"{what} key {info.label}: dtype {arr.dtype} does not match the "
                            f"initialized dtype {info.dtype}")
        return np.ascontiguousarray(arr)

    # -- operations ----------------------------------------------------------------------
    def init(self, key: Any, value: Any, labels: Any = None, members: Sequence[int] | None = None) -> None:
        """Collective: every worker calls it with the same keys; rank 0's value is stored.

        ``labels`` (a str, or one per key): how error messages name the keys, for a caller
        that moved its users' keys (ps.mxnet's second kvstore of a process) so that errors,
        the servers' too, name the key the user wrote.
        ``members``: the ranks that alone push these keys (a Horovod process set): their sync
        rounds close when those ranks pushed. Only they call init; the lowest of them tells
        the servers and sends its values, and nobody waits for the others, so the members
        must meet (a pushpull of a key they already share) before any of them pushes.
        Raises ValueError for a key initialized twice, RemoteError if a server refuses.
        """
        self._check_open()
        group = None if members is None else self._members(members)
        pairs = self._pairs(key, value)
        labels = [None] * len(pairs) if labels is None else [labels] if isinstance(labels, str) else list(labels)
        if len(labels) != len(pairs):
            raise ValueError(f"{len(pairs)} keys but {len(labels)} labels")
        infos = []
        for (k, v), label in zip(pairs, labels):
            arr = np.asarray(v[0] if isinstance(v, (list, tuple)) else v)
            infos.append((self._new_info(k, arr, label), arr))
        requests = []
        sender = 0 if group is None else group[0]
        for info, arr in infos:
            self._keys[info.name] = info
        if group is not None and self.rank == sender:
            self._worker.command("set_members", {"keys": [info.key for info, _ in infos], "ranks": group})
        for info, arr in infos:
            if self.rank == sender:
                flat = np.ascontiguousarray(arr).reshape(-1)
                requests.append(self._request(Op.INIT, info, flat, None, f"init of key {info.label}"))
        self._worker.flush()
        if group is not None:
            self._finish(requests, lambda: None, block=True)
            return
        error = None
        try:
            self._finish(requests, lambda: None, block=True)
        except PSError as exc:   # still join the barrier, or the other workers would hang
            error = exc
        self._po.barrier("workers", what="every worker to finish init")
        if error is not None:
            raise error

    def declare(self, key: Any, shape: Sequence[int], dtype: Any, joinable: bool = False) -> None:
        """Register ``key`` on this worker alone: no message, no barrier. The servers make it,
        zeros, when the first worker's push of it arrives, so workers may declare a key at
        different moments (Horovod's collectives, whose first use of a name meets nobody:
        a worker may start one while another is at a barrier). For keys whose value is the
        last round's sum (no optimizer on the servers); a pull before any push finds no key.
        ``joinable``: while workers are in :meth:`join`, the key's rounds close without them
        (a sum that takes their share as zero); other keys' rounds fail then."""
        self._check_open()
        value = np.broadcast_to(np.zeros((), np.dtype(dtype)), tuple(int(d) for d in shape))    # no memory
        dtype_code(value.dtype)                 # an unsupported dtype is named now
        info = self._new_info(key, value)
        self._keys[info.name] = replace(info, declared=True, joinable=bool(joinable))

    def join(self, timeout: float | None = None) -> Joined:
        """Horovod's ``join``, for uneven data: this worker has no more pushes until every
        worker called join. Meanwhile the other workers' rounds of ``joinable`` keys close
        without it (its share zero), and their other rounds fail with CollectiveError
        naming it. Returns the rank of the last worker to join (the same everywhere) and,
        per key, the rounds closed without this worker.

        Waits as long as the other workers train (``timeout`` seconds if given); a worker
        that dies meanwhile ends the wait with an error."""
        self._check_open()
        # this worker's last requests end first (a refused one is its own handle's to report)
        self._worker.wait_all(Deadline(self._timeout if timeout is None else timeout), errors=False)
        self._worker.command("join", {"rank": self.rank})
        self._po.barrier("workers", deadline=Deadline(timeout), what="every worker to join (kv.join)")
        answers = self._worker.command("leave", {"rank": self.rank})
        skipped: dict[int, int] = {}
        for answer in answers.values():
            for key, rounds in answer["skipped"]:
                skipped[int(key)] = max(skipped.get(int(key), 0), int(rounds))
        self._worker.skip_rounds(skipped)
        # nobody pushes before every worker left the join on every server
        self._po.barrier("workers", what="every worker to leave the join (kv.join)")
        return Joined(int(answers[min(answers)]["last"]), skipped)

    def _members(self, members: Sequence[int]) -> list[int]:
        """``members`` checked: ranks of this job, this one among them; sorted, once each."""
        ranks = sorted({int(r) for r in members})
        bad = [r for r in ranks if not 0 <= r < self.num_workers]
        if not ranks or bad:
            raise ValueError(f"members {list(members)!r}: not a non-empty list of ranks of this job's "
                             f"{self.num_workers} workers")
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not one of the members {ranks} it initializes keys for")
        return ranks

    def push(self, key: Any, value: Any, priority: int = 0, block: bool = False) -> Handle | None:
        """Send a gradient (summed over a list); returns a Handle (``block=True`` waits).

        The array must not change until the push is waited on (it is sent zero-copy).
        """
        self._check_open()
        handles = []
        for k, v in self._pairs(key, value):
            info = self._info(k)
            what = f"push to key {info.label}"
            if _is_rows(v):
                rows, values = self._rows_value(info, v)
                handles.append(self._worker.request_rows(Op.PUSH, info.key, info.slices, info.dtype_code,
                                                         info.row_len, rows, values, None, what, priority))
                continue
            flat = self._value(info, v, "push to").reshape(-1)
            handles.append(self._request(Op.PUSH, info, flat, None, what, priority))
        return self._finish(handles, lambda: None, block, key)

    def row_sparse_pull(self, key: Any, row_ids: Any, priority: int = 0, block: bool = True) -> Any:
        """Fetch rows ``row_ids`` (any shape, repeats allowed) of ``key``: a RowSparse of
        those rows, each once and in increasing order, as MXNet's ``row_sparse_pull``
        (after this worker's earlier pushes to the key). Only those rows travel."""
        self._check_open()
        info = self._info(key)
        rows = self._row_ids(info, row_ids)
        values = np.empty((rows.size,) + info.shape[1:], info.dtype)
        requests = []
        if rows.size:
            requests.append(self._worker.request_rows(Op.PULL, info.key, info.slices, info.dtype_code, info.row_len,
                                                      rows, None, values.reshape(-1), f"row_sparse_pull of key {info.label}",
                                                      priority))
        return self._finish(requests, lambda: RowSparse(rows, values), block)

    def _row_ids(self, info: KeyInfo, row_ids: Any) -> np.ndarray:
        """Sorted distinct int64 row ids, checked against the key's rows."""
        return np.unique(self._check_rows(info, np.asarray(row_ids).reshape(-1)))

    def _rows_value(self, info: KeyInfo, value: Any) -> tuple[np.ndarray, np.ndarray]:
        """The rows of a RowSparse push (a list is summed), sorted, each once, values 2-D."""
        parts = list(value) if isinstance(value, (list, tuple)) and not isinstance(value, RowSparse) else [value]
        all_rows, all_values = [], []
        for part in parts:
            rows = np.asarray(part.rows).reshape(-1)
            values = np.asarray(part.values)
            if values.shape != (rows.size,) + info.shape[1:]:
                raise ValueError(f"push to key {info.label}: {rows.size} rows need values of shape "
                                 f"{(rows.size,) + info.shape[1:]}, got {values.shape}")
            if values.dtype != info.dtype:
                raise TypeError(f"push to key {info.label}: dtype {values.dtype} does not match the "
                                f"initialized dtype {info.dtype}")
            all_rows.append(self._check_rows(info, rows))
            all_values.append(values.reshape(rows.size, info.row_len))
        rows, values = np.concatenate(all_rows), np.concatenate(all_values)
        unique, inverse = np.unique(rows, return_inverse=True)
        if unique.size == rows.size:
            order = np.argsort(rows, kind="stable")
            return rows[order], np.ascontiguousarray(values[order])
        summed = np.zeros((unique.size, info.row_len), info.dtype)
        np.add.at(summed, inverse.reshape(-1), values)
        return unique, summed

    @staticmethod
    def _check_rows(info: KeyInfo, rows: np.ndarray) -> np.ndarray:
        """int64 row ids (MXNet passes them as floats), each a row of the key."""
        if not info.shape:
            raise ValueError(f"key {info.label} is a scalar: it has no rows")
        if rows.size and not np.issubdtype(rows.dtype, np.integer):
            as_int = rows.astype(np.int64)
            if not np.array_equal(as_int, rows):
                raise ValueError(f"row ids of key {info.label} must be whole numbers, got {rows[as_int != rows][:3]}")
            rows = as_int
        rows = rows.astype(np.int64, copy=False)
        if rows.size and (rows.min() < 0 or rows.max() >= info.shape[0]):
            bad = rows.min() if rows.min() < 0 else rows.max()
            raise ValueError(f"row id {bad} is out of range for key {info.label} of shape {info.shape}")
        return rows


    def pull(self, key: Any, out: Any = None, priority: int = 0, block: bool = True,
             ignore_sparse: bool = True) -> Any:
        """Fetch the current value (after this worker's earlier pushes to the key)."""
        self._check_open()
        return self._pull_like(Op.PULL, key, None, out, block, priority)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, block: bool = True) -> Any:
        """Push and pull in one round trip; returns the updated value (or a Handle)."""
        self._check_open()
        return self._pull_like(Op.PUSH | Op.PULL, key, value, out, block, priority)

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """init (rank 0's value wins) then pull into ``out``."""
        self.init(key, value)
        return self.pull(key, out=out, priority=priority)

    def _pull_like(self, op: int, key: Any, value: Any, out: Any, block: bool, priority: int = 0) -> Any:
        many = isinstance(key, (list, tuple))
        names = key if many else [key]
        values = [None] * len(names) if value is None else value if many else [value]
        outs = out if many and out is not None else [out] * len(names)
        if len(values) != len(names) or len(outs) != len(names):
            raise ValueError(f"{len(names)} keys but {len(values)} values / {len(outs)} outputs")
        handles, finals = [], []
        for k, v, o in zip(names, values, outs):
            info = self._info(k)
            flat = None if v is None else self._value(info, v, "pushpull to").reshape(-1)
            recv, final = self._receiver(info, o)
            what = f"{'pushpull' if op & Op.PUSH else 'pull'} of key {info.label}"
            handles.append(self._request(op, info, flat, recv.reshape(-1), what, priority))
            finals.append(final)
        if isinstance(key, (list, tuple)):
            return self._finish(handles, lambda: [f() for f in finals], block, key)
        return self._finish(handles, finals[0], block, key)

    def _receiver(self, info: KeyInfo, out: Any) -> tuple[np.ndarray, Any]:
        """An array replies can be written into, and what to return once they are."""
        if out is None:
            arr = np.empty(info.shape, info.dtype)
            return arr, lambda: arr
        targets = list(out) if isinstance(out, (list, tuple)) else [out]
        for t in targets:
            if not isinstance(t, np.ndarray) or t.shape != info.shape:
                raise ValueError(f"out for key {info.label} must be a numpy array of shape {info.shape}, "
                                 f"got {getattr(t, 'shape', type(t).__name__)}")
        first = targets[0]
        direct = first.dtype == info.dtype and first.flags.c_contiguous and first.flags.writeable
        recv = first if direct else np.empty(info.shape, info.dtype)

        def final() -> Any:
            for t in targets:
                if t is not recv:
                    np.copyto(t, recv, casting="unsafe")
            return out
        return recv, final

    def _request(self, op: int, info: KeyInfo, value: np.ndarray | None, out: np.ndarray | None,
                 what: str, priority: int = 0) -> Request:
        encode = None
        if value is not None and op & Op.PUSH and self._compression and info.dtype == np.float32:
            if self._compression["type"] == "2bit":
                residual = self._residuals.get(info.key)
                if residual is None:
                    residual = self._residuals[info.key] = np.zeros(info.size, np.float32)
                value = comp.quantize_2bit(value, residual, self._compression["threshold"])
                op, encode = op | Op.TWO_BIT, comp.pack_2bit
            else:
                op, value = op | Op.FP16, value.astype(np.float16)
        if op & Op.PULL and self._compression and self._compression.get("pull") and info.dtype == np.float32:
            op |= Op.HALF_PULL
        if info.declared and op & Op.PUSH:
            op |= Op.CREATE | (Op.JOINABLE if info.joinable else 0)
        return self._worker.request(op, info.key, info.slices, info.dtype_code, value, out, what, encode, priority)

    def _finish(self, requests: list[Request], finalize: Any, block: bool, key: Any = None) -> Any:
        """Blocking calls send now; non-blocking ones leave with the I/O thread's next
        flush, together with whatever else was issued meanwhile. ``key`` (one or a list):
        what the call is shown as on a timeline."""
        handle = self._worker.handle(requests, finalize)
        timeline = self._timeline
        if timeline is not None:
            for k in key if isinstance(key, (list, tuple)) else [key]:
                ended = timeline.started(k)
                if ended is not None:
                    handle.add_done_callback(lambda _h, ended=ended: ended())
        if not block:
            return handle
        self._worker.flush()
        return handle.wait()

    def record(self, timeline: Recorder | None) -> None:
        """Show this worker's requests on ``timeline`` (a :class:`Recorder`: Horovod's
        timeline); None stops. The caller closes the timeline."""
        self._timeline = timeline
        self._worker.on_flush = None if timeline is None else timeline.cycle

    @staticmethod
    def _pairs(key: Any, value: Any) -> list[tuple[Any, Any]]:
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                raise ValueError(f"{len(key)} keys need a list of {len(key)} values")
            return list(zip(key, value))
        return [(key, value)]

    # -- cluster-wide --------------------------------------------------------------------
    def set_optimizer(self, optimizer: Any, namespace: int = 0) -> None:
        """Collective: run ``optimizer`` (a ``ps.optim`` optimizer or its spec) on the servers,
        for the keys of ``namespace`` (:meth:`set_namespace`; 0: every other key).

        Sent once, by rank 0; every worker then waits at a barrier so none pushes early.
        """
        self._check_open()
        spec = optimizer.to_spec() if hasattr(optimizer, "to_spec") else dict(optimizer)
        spec = _int_keyed(spec)
        if self.rank == 0:
            self._worker.command("set_optimizer", {"spec": spec, **namespace_field(namespace)})
        self._po.barrier("workers", what="every worker to set the optimizer")

    def set_pickled_optimizer(self, payload: bytes, signature: bytes, namespace: int = 0) -> None:
        """Collective, opt-in (PS_ALLOW_PICKLE on the servers): see ps/optim/pickled.py."""
        self._check_open()
        if self.rank == 0:
            self._worker.command("set_optimizer_pickle", {"payload": payload, "signature": signature,
                                                          **namespace_field(namespace)})
        self._po.barrier("workers", what="every worker to set the optimizer")

    def set_namespace(self, keys: Any, namespace: int) -> None:
        """Give initialized ``keys`` the optimizer of ``namespace`` (a number > 0) instead of
        the store's own: two MXNet Trainers in one process (a GAN) each have theirs. Every
        worker may call it (it is idempotent); it returns when every server knows."""
        self._check_open()
        ints = [self._info(k).key for k in (keys if isinstance(keys, (list, tuple)) else [keys])]
        self._worker.command("set_namespace", {"keys": ints, **namespace_field(namespace)})

    def set_gradient_compression(self, params: dict[str, Any]) -> None:
        """Collective: compress float32 keys' pushes (``{'type': '2bit', 'threshold': 0.5}`` as
        MXNet: pulls stay exact) or pushes and pulls (``{'type': 'fp16'}``; add ``'pull': False``
        to pull exact float32). The servers keep float32 either way. Set it before training."""
        self._check_open()
        parsed = comp.parse(params)
        if self.rank == 0:
            self._worker.command("set_compression", {"params": parsed})
        self._po.barrier("workers", what="every worker to set gradient compression")
        self._compression = parsed
        self._residuals = {}

    def server_command(self, cmd: str, payload: dict[str, Any] | None = None,
                       servers: list[int] | None = None, namespace: int = 0) -> dict[int, Any]:
        """Run a server command (``stats``, ``get_states``, ...) on ``servers`` (default all)
        and wait for every answer: {server id: result}. Raises RemoteError if one fails.
        ``namespace``: whose optimizer ``set_params``/``get_states``/``set_states`` mean."""
        self._check_open()
        return self._worker.command(cmd, {**(payload or {}), **namespace_field(namespace)}, servers=servers)

    def barrier(self, timeout: float | None = None, wait: bool = True) -> None:
        """Block until every worker reaches its barrier; first, unless ``wait=False``
        (Horovod's barrier), until this worker's own requests are answered."""
        self._check_open()
        if wait:
            self.wait_all(timeout)
        self._po.barrier("workers", timeout=timeout)

    def wait_all(self, timeout: float | None = None) -> None:
        """Wait for every outstanding push/pull of this worker."""
        self._worker.wait_all(Deadline(self._timeout if timeout is None else timeout))

    def close(self) -> None:
        """Finish outstanding requests, tell the scheduler, disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        try:
            if self._po.failure is None:
                self.wait_all(self._timeout or CLOSE_WAIT)
        except PSTimeoutError as exc:
            logger.warning("closing with requests still outstanding after %gs: %s",
                           self._timeout or CLOSE_WAIT, exc)
        except PSError:
            pass
        finally:
            # whatever is still outstanding ends now, with an error: nobody waits on it forever
            # (a pushpull in MXNet's engine completes its engine operation on it)
            self._worker.fail_all(ClosedError("the store was closed before this request was answered"))
            self._po.announce_close()
            self._po.close(linger=1.0)


def _int_keyed(spec: dict[str, Any]) -> dict[str, Any]:
    """Per-key multipliers travel under the servers' int keys (str keys are hashed)."""
    params = dict(spec.get("params", {}))
    for name in ("lr_mult", "wd_mult"):
        if params.get(name):
            params[name] = {keys_mod.to_int_key(k): v for k, v in params[name].items()}
    return {**spec, "params": params}


def _is_rows(value: Any) -> bool:
    if isinstance(value, RowSparse):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, RowSparse) for v in value)
