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
import logging
import weakref
from dataclasses import replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from . import compression as comp
from . import keys as keys_mod
from ._timing import Deadline
from .config import Config
from .customer import Handle, Request
from .embed import Table, TableSpec
from .errors import ClosedError, ConfigError, PSError, PSTimeoutError
from .frames import dtype_code
from .message import Op, Role, namespace_field
from .postoffice import Postoffice
from .keyinfo import (KeyInfo, KeyTable, RowSparse, dense, int_keyed, is_rows, key_labels, member_ranks, pairs,
                      receiver, row_sparse, triples, unique_rows)
from .van import Van
from .waitreport import WaitReporter
from .worker import Joined, KVWorker

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


class KVStore:
    """A worker's connection to the parameter servers.

    Raises ConfigError for a bad environment, PSTimeoutError if the cluster does not
    form within PS_CONNECT_TIMEOUT, PeerLostError when another node dies.
    """

    def __init__(self, type: str = "dist_sync", config: Config | None = None, van: Van | None = None):
        if type not in TYPES:
            raise ValueError(f"unknown kvstore type {type!r}; use one of {', '.join(TYPES)}")
        cfg = config or Config.from_env()
        joint = cfg.is_joint        # a worker holding its own server shard (ps/joint.py)
        if joint:
            cfg = cfg.replace(role="worker")
        if not cfg.is_worker:
            raise ConfigError(f"DMLC_ROLE={cfg.role!r}: a KVStore runs on workers (or joint processes); start "
                              "servers and the scheduler with `python -m ps`")
        if cfg.verbose:
            from . import _logging
            _logging.setup(cfg.verbose, "[worker] ")
        self._type = type
        self._sync = "async" not in type
        self._po = Postoffice(cfg, van)
        self._worker = KVWorker(self._po)
        self._keys = KeyTable(cfg.num_servers, cfg.bigarray_bound)
        self._compressor: comp.Compressor | None = None     # set_gradient_compression
        self._closed = False
        self._round = 0
        self._timeline: Recorder | None = None
        self._members: dict[int, tuple[int, ...]] = {}     # server key -> its only pushers (init's members)
        self._waits: WaitReporter | None = None
        self._joint: Any = None
        try:
            if joint:       # before this worker registers: the cluster forms only once its server did too
                from .joint import JointServer
                self._joint = JointServer(cfg)
            self._po.start({"sync": self._sync, "chunk": self._po.config.chunk_bytes})
            if self._po.restarted:
                self._round = self._rejoin()
                self._po.rejoined()
        except BaseException:
            self._po.close(linger=0)
            if self._joint is not None:
                self._joint.stop()
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
        return self._keys.kind

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

    def server_links(self) -> dict[int, str]:
        """How this worker reaches each server, by rank: "inproc" (its own shard: a joint
        process), "ipc" (a server on this machine), "tcp" (over the network)."""
        return {self._po.nodes[sid].rank: self._po.links.link_kind(sid) for sid in self._po.server_ids}

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ps.KVStore {self._type} rank {self.rank}/{self.num_workers}, {self.num_servers} servers>"

    # -- operations ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this KVStore is closed")
        if self._po.failure is not None:
            raise self._po.failure

    def init(self, key: Any, value: Any, labels: Any = None, members: Sequence[int] | None = None,
             root: int = 0) -> None:
        """Collective: every worker calls it with the same keys; rank ``root``'s value is stored.

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
        group = None if members is None else member_ranks(members, self.rank, self.num_workers)
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.num_workers:
            raise ValueError(f"init of key {key!r}: root rank must be an int in [0, {self.num_workers}), got {root!r}")
        named = pairs(key, value)
        infos = []
        for (k, v), label in zip(named, key_labels(labels, len(named))):
            arr = np.asarray(v[0] if isinstance(v, (list, tuple)) else v)
            infos.append((self._keys.new(k, arr, label), arr))
        requests = []
        sender = int(root) if group is None else group[0]
        for info, arr in infos:
            self._keys.add(info)
            if group is not None:
                self._members[info.key] = tuple(group)
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

    def declare(self, key: Any, shape: Sequence[int], dtype: Any, joinable: bool = False,
                server: int | None = None) -> None:
        """Register ``key`` on this worker alone: no message, no barrier. The servers make it,
        zeros, when the first worker's push of it arrives, so workers may declare a key at
        different moments (Horovod's collectives, whose first use of a name meets nobody:
        a worker may start one while another is at a barrier). For keys whose value is the
        last round's sum (no optimizer on the servers); a pull before any push finds no key.
        ``joinable``: while workers are in :meth:`join`, the key's rounds close without them
        (a sum that takes their share as zero); other keys' rounds fail then. ``server``: the
        server a key below MXNET_KVSTORE_BIGARRAY_BOUND lives on, in place of its hash's
        (``ps.keys.balance``); every worker must declare the key with the same."""
        self._check_open()
        value = np.broadcast_to(np.zeros((), np.dtype(dtype)), tuple(int(d) for d in shape))    # no memory
        dtype_code(value.dtype)                 # an unsupported dtype is named now
        self._keys.add(replace(self._keys.new(key, value, server=server), declared=True, joinable=bool(joinable)))

    def join(self, timeout: float | None = None) -> Joined:
        """Horovod's ``join``, for uneven data: this worker has no more pushes until every
        worker called join. Meanwhile the other workers' rounds of ``joinable`` keys close
        without it (its share zero), and their other rounds fail with CollectiveError
        naming it. Returns the rank of the last worker to join (the same everywhere) and,
        per key, the rounds closed without this worker.

        Waits as long as the other workers train (``timeout`` seconds if given); a worker
        that dies meanwhile ends the wait with an error."""
        self._check_open()
        return self._worker.join(self.rank, Deadline(self._timeout if timeout is None else timeout), Deadline(timeout))

    def push(self, key: Any, value: Any, priority: int = 0, block: bool = False) -> Handle | None:
        """Send a gradient (summed over a list); returns a Handle (``block=True`` waits).

        The array must not change until the push is waited on (it is sent zero-copy).
        """
        self._check_open()
        handles = []
        for k, v in pairs(key, value):
            info = self._keys.info(k)
            what = f"push to key {info.label}"
            if is_rows(v):
                rows, values = row_sparse(info, v)
                handles.append(self._worker.request_rows(Op.PUSH, info.key, info.slices, info.dtype_code,
                                                         info.row_len, rows, values, None, what, priority))
                continue
            flat = dense(info, v, "push to").reshape(-1)
            handles.append(self._request(Op.PUSH, info, flat, None, what, priority))
        return self._finish(handles, lambda: None, block, key)

    def row_sparse_pull(self, key: Any, row_ids: Any, priority: int = 0, block: bool = True) -> Any:
        """Fetch rows ``row_ids`` (any shape, repeats allowed) of ``key``: a RowSparse of
        those rows, each once and in increasing order, as MXNet's ``row_sparse_pull``
        (after this worker's earlier pushes to the key). Only those rows travel."""
        self._check_open()
        info = self._keys.info(key)
        rows = unique_rows(info, row_ids)
        values = np.empty((rows.size,) + info.shape[1:], info.dtype)
        requests = []
        if rows.size:
            requests.append(self._worker.request_rows(Op.PULL, info.key, info.slices, info.dtype_code, info.row_len,
                                                      rows, None, values.reshape(-1), f"row_sparse_pull of key {info.label}",
                                                      priority))
        return self._finish(requests, lambda: RowSparse(rows, values), block)

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
        handles, finals = [], []
        for k, v, o in triples(key, value, out):
            info = self._keys.info(k)
            flat = None if v is None else dense(info, v, "pushpull to").reshape(-1)
            recv, final = receiver(info, o)
            what = f"{'pushpull' if op & Op.PUSH else 'pull'} of key {info.label}"
            handles.append(self._request(op, info, flat, recv.reshape(-1), what, priority))
            finals.append(final)
        if isinstance(key, (list, tuple)):
            return self._finish(handles, lambda: [f() for f in finals], block, key)
        return self._finish(handles, finals[0], block, key)

    def _request(self, op: int, info: KeyInfo, value: np.ndarray | None, out: np.ndarray | None,
                 what: str, priority: int = 0) -> Request:
        encode = None
        if self._compressor is not None and info.dtype == np.float32:
            bits, value, encode = self._compressor.wire(info.key, value, bool(op & Op.PUSH), bool(op & Op.PULL))
            op |= bits
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

    def table(self, spec: TableSpec) -> Table:
        """Declare the embedding table ``spec`` on every server and return it (ps/embed/).
        Every worker declares it alike; a different one under the same name is refused,
        naming both."""
        self._check_open()
        self._worker.command("table", {"spec": spec.to_wire()})
        return Table(spec, self._worker, self.num_servers)

    def check_deadlocks(self, describe: Callable[[str], str] | None = None) -> WaitReporter | None:
        """Have the scheduler judge this worker's long waits (PS_DEADLOCK_CHECK, ps/waits.py):
        when every worker waits for a round another will never push, each wait raises
        MismatchError on every worker, and the job goes on. For callers whose every push is
        made by the thread that then waits for it, in the same order on every worker
        (Horovod's collectives): a push another thread of this process makes later is not
        foreseen. ``describe(key name)``: how an error names a key. Returns the reporter (its
        ``listeners`` hear each verdict), None when PS_DEADLOCK_CHECK is 0 or the store is async."""
        after = self._po.config.deadlock_check
        if not after or not self._sync:
            return None
        if self._waits is None:
            self._waits = WaitReporter.watching(self._po, self._worker, after, self._keys.infos,
                                                describe or (lambda name: f"key {name!r}"),
                                                lambda key: self._members.get(key, ()))
        return self._waits

    def record(self, timeline: Recorder | None) -> None:
        """Show this worker's requests on ``timeline`` (a :class:`Recorder`: Horovod's
        timeline); None stops. The caller closes the timeline."""
        self._timeline = timeline
        self._worker.on_flush = None if timeline is None else timeline.cycle

    # -- cluster-wide --------------------------------------------------------------------
    def set_optimizer(self, optimizer: Any, namespace: int = 0) -> None:
        """Collective: run ``optimizer`` (a ``ps.optim`` optimizer or its spec) on the servers,
        for the keys of ``namespace`` (:meth:`set_namespace`; 0: every other key).

        Sent once, by rank 0; every worker then waits at a barrier so none pushes early.
        """
        spec = optimizer.to_spec() if hasattr(optimizer, "to_spec") else dict(optimizer)
        self._from_rank0("set_optimizer", {"spec": int_keyed(spec), **namespace_field(namespace)},
                         "every worker to set the optimizer")

    def set_pickled_optimizer(self, payload: bytes, signature: bytes, namespace: int = 0) -> None:
        """Collective, opt-in (PS_ALLOW_PICKLE on the servers): see ps/optim/pickled.py."""
        self._from_rank0("set_optimizer_pickle", {"payload": payload, "signature": signature,
                                                  **namespace_field(namespace)}, "every worker to set the optimizer")

    def _from_rank0(self, cmd: str, body: dict[str, Any], what: str) -> None:
        """A setting every worker asks for: rank 0 sends it, and all wait at a barrier, so that
        no worker pushes before the servers have it."""
        self._check_open()
        if self.rank == 0:
            self._worker.command(cmd, body)
        self._po.barrier("workers", what=what)

    def set_namespace(self, keys: Any, namespace: int) -> None:
        """Give initialized ``keys`` the optimizer of ``namespace`` (a number > 0) instead of
        the store's own: two MXNet Trainers in one process (a GAN) each have theirs. Every
        worker may call it (it is idempotent); it returns when every server knows."""
        self._check_open()
        ints = [self._keys.info(k).key for k in (keys if isinstance(keys, (list, tuple)) else [keys])]
        self._worker.command("set_namespace", {"keys": ints, **namespace_field(namespace)})

    def set_gradient_compression(self, params: dict[str, Any]) -> None:
        """Collective: compress float32 keys' pushes (``{'type': '2bit', 'threshold': 0.5}`` as
        MXNet: pulls stay exact) or pushes and pulls (``{'type': 'fp16'}``; add ``'pull': False``
        to pull exact float32). The servers keep float32 either way. Set it before training."""
        parsed = comp.parse(params)
        self._from_rank0("set_compression", {"params": parsed}, "every worker to set gradient compression")
        self._compressor = comp.Compressor(parsed)

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
            if self._joint is not None:     # it serves the others until the last worker closed
                self._joint.wait(self._timeout or CLOSE_WAIT)

