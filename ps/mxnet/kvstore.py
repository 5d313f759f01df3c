"""``PSKVStore``: a ps worker behind MXNet's kvstore interface, and the key namespaces that
keep a process's several stores apart on the one ps worker they share.

What the servers optimize with is ps/mxnet/optimizer.py; how MXNet finds these stores
(registration, patched ``create``/``waitall``/Trainer, the fork and exit hooks) is
ps/mxnet/hooks.py.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import types
import weakref
from typing import Any, Iterator

import mxnet as mx
import numpy as np

from ..collective import selfstart
from ..config import role_from_env
from ..errors import ConfigError
from ..kvstore import CLOSE_WAIT, KVStore, RowSparse
from .arrays import as_list, first, flatten, is_int_key, is_sparse, to_numpy
from .engine_ops import EnginePushpulls
from .optimizer import ServerOptimizer, load_states, optimizer_in_command, save_states

logger = logging.getLogger(__name__)

_shared: KVStore | None = None
_live_stores: "weakref.WeakSet[PSKVStore]" = weakref.WeakSet()
_namespaces = itertools.count()     # handed out in the order stores first init or set an optimizer
_claimed: "weakref.WeakSet[PSKVStore]" = weakref.WeakSet()     # the stores that took one
NS_SHIFT = 50                       # a second store's int key k travels as ns << NS_SHIFT | k
_failed_at_exit: list[str] = []     # what a store found at exit that the script never saw


def shared_store() -> KVStore | None:
    """This process's ps worker, if a kvstore made one and it is open."""
    return _shared if _shared is not None and not _shared.closed else None


def _store(name: str) -> KVStore:
    """One ps worker per process: every registered kvstore instance shares it. ``name`` is
    the MXNet kvstore's."""
    global _shared
    kvtype = ps_type(name)
    if _shared is None or _shared.closed:
        if is_mpi(name):
            _joint_ranks(name, joining=True)
        _shared = KVStore(kvtype)
    elif is_mpi(name):
        _joint_ranks(name, joining=False)
    if ("async" in _shared.type) != ("async" in kvtype):
        raise ValueError(f"this process already joined the cluster as {_shared.type!r}; "
                         f"cannot also create {name!r}")
    return _shared


def is_mpi(name: str) -> bool:
    """MXNet's MPI proposal's names (``dist_sync_mpi``, ``dist_async_mpi``): a job of joint ranks."""
    return name.endswith("_mpi")


def _joint_ranks(name: str, joining: bool) -> None:
    """``dist_sync_mpi`` runs on joint ranks, each a worker holding its own server shard:
    under a bare mpirun/srun the ranks make the rendezvous here (rank 0 starts the
    scheduler; ``joining``: this process has no store yet); started by ``ps.launch --mode
    mpi`` or by hand with ``DMLC_ROLE=joint``, they are joint already. Refused beside
    separate servers: the script asked for a job without them, and a job that has them was
    launched for ``dist_sync``."""
    if joining and selfstart.start(joint=True) is not None:
        return
    role = role_from_env()
    if role == "joint":
        return
    if "DMLC_PS_ROOT_URI" not in os.environ:
        raise ConfigError(f"kvstore {name!r} runs on joint ranks (each a worker holding a server shard): start "
                          "the script with mpirun or srun, with `python -m ps.launch --mode mpi`, or by hand with "
                          "DMLC_ROLE=joint and the DMLC_* variables (docs/mxnet.md)")
    raise ConfigError(f"kvstore {name!r} runs on joint ranks, but this process is a {role} (DMLC_ROLE={role}) of a "
                      "job with separate server processes: launch it with `python -m ps.launch --mode mpi` "
                      "(no -s), or ask for kvstore 'dist_sync' in this job")


class PSKVStore(mx.kvstore.KVStore):
    """A ps worker behind MXNet's kvstore interface (instantiated by MXNet, no arguments).

    It derives from MXNet's own ``KVStore``, not only from ``KVStoreBase``: MXNet's sparse
    paths (``Trainer._init_kvstore``, ``model._create_sparse_kvstore``) accept only that
    class. It has no C handle (``handle`` is None): every method of ``KVStore`` that uses
    one is overridden here.
    """

    _TYPE = "dist_sync"             # the name the script asked for: what ``type`` reports

    def __init__(self) -> None:     # not KVStore.__init__: there is no C kvstore behind it
        self.handle = None
        self._kv = _store(self._TYPE)
        self._ns: int | None = None         # its namespace on the servers: see _claim
        self._compression: dict[str, Any] | None = None    # what this store asked for
        self._updater: Any = None           # Trainer.load_states reads ._updater.optimizer
        self._defer = 0
        self._pending: list[tuple[Any, Any]] = []   # (handle, the arrays it reads/writes: kept alive)
        self._queued: list[tuple[Any, Any, Any, int]] = []
        self._engine = EnginePushpulls(self._kv)
        self._opt = ServerOptimizer(self._kv, self._engine)
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref()._at_exit())
        _live_stores.add(self)

    def __del__(self) -> None:      # KVStore.__del__ would free the C handle there is not
        pass

    # -- properties MXNet reads ------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._TYPE

    @property
    def rank(self) -> int:
        return self._kv.rank

    @property
    def num_workers(self) -> int:
        return self._kv.num_workers

    def transport_stats(self) -> dict[str, int]:
        """ps's transport counters (bytes sent and received, resends...): ``ps.KVStore.transport_stats``."""
        return self._kv.transport_stats()

    def server_stats(self) -> dict[int, dict[str, Any]]:
        """What each server stores (``ps.KVStore.server_command("stats")``): {server id: {"bytes",
        "keys", ...}}, with each server's ``port`` added so a caller can tell the processes apart."""
        replies = self._kv.server_command("stats")
        return {sid: {**r, "port": self._kv.nodes[sid].port} for sid, r in replies.items()}

    # ps's restarts (--max-restarts): see ps.KVStore and docs/reliability.md
    @property
    def restarted(self) -> bool:
        """This worker replaces one that died."""
        return self._kv.restarted

    @property
    def round(self) -> int:
        """The sync rounds the dead worker had completed (0 unless :attr:`restarted`)."""
        return self._kv.round

    def resume(self) -> int:
        """Count this worker's next push to each key as round :attr:`round` + 1 (a script that
        skips to that step itself); returns :attr:`round`."""
        return self._kv.resume()

    @staticmethod
    def is_capable(capability: str) -> bool:
        if capability.lower() == mx.kvstore.KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"Unknown capability: {capability}")

    # -- data ------------------------------------------------------------------------------
    def init(self, key: Any, value: Any, root_rank: int = 0) -> None:
        self._engine.settle()
        ns = self._claim()
        keys = self._keyed(key)
        taken = [k for k, moved in zip(as_list(key), as_list(keys))
                 if is_int_key(k) and self._kv.key_info(moved) is not None]
        if taken:
            raise ValueError(
                f"key {taken[0]} is already initialized in this kvstore: a gluon.Trainer numbers its "
                "parameters 0, 1, ..., so two Trainers given the same kvstore object reuse each other's "
                "keys (MXNet's own dist kvstore hangs there). Give each Trainer its own store "
                "(kvstore='dist_sync', or one mx.kv.create each: ps keeps their keys and optimizers "
                "apart), or put every parameter in one Trainer (docs/mxnet.md)")
        self._kv.init(keys, first(to_numpy(value), key),
                      labels=[self._label(k) for k in as_list(key)] if ns else None, root=root_rank)
        if ns:
            self._kv.set_namespace(keys, ns)

    def _claim(self) -> int:
        """This store's namespace, taken when it first initializes keys or sets an optimizer:
        the first such store of the process has 0 (its keys are the script's own), a second
        (a GAN's second Trainer) 1, ... Every worker runs the same script, so every worker
        numbers its stores alike, and a restarted one again."""
        if self._ns is None:
            _same_compression(self, self._compression)
            self._ns = next(_namespaces)
            _claimed.add(self)
        return self._ns

    def _label(self, key: Any) -> str:
        """How errors name a key of this store: its moved ps key would mean nothing to the user."""
        return f"{key!r} (of this process's kvstore number {self._ns + 1})" if self._ns else repr(key)

    @contextlib.contextmanager
    def _errors(self, key: Any) -> Iterator[None]:
        """MXNet raises MXNetError for a key that was never initialized; so does ps.mxnet,
        naming the key the script wrote."""
        try:
            yield
        except KeyError as exc:
            missing = [k for k, moved in zip(as_list(key), as_list(self._keyed(key)))
                       if self._kv.key_info(moved) is None] if self._ns else []
            if missing:
                raise mx.base.MXNetError(f"key {self._label(missing[0])} is not initialized; call "
                                         f"kv.init({missing[0]!r}, value) first") from None
            raise mx.base.MXNetError(exc.args[0] if exc.args else str(exc)) from None

    def _keyed(self, key: Any) -> Any:
        """The ps key of this store's ``key``: itself in namespace 0; else an int key moved
        above every key a script uses, a str key suffixed."""
        if isinstance(key, (list, tuple)):
            return [self._keyed(k) for k in key]
        ns = self._ns
        if not ns:
            return key
        if isinstance(key, str):
            return f"{key}#kvstore{ns}"
        if is_int_key(key):                 # numpy's too, as MXNet takes them
            if not 0 <= key < 1 << NS_SHIFT:
                raise ValueError(f"key {key}: a second kvstore of a process takes int keys in [0, 2**{NS_SHIFT})")
            return ns << NS_SHIFT | int(key)
        return key                          # the store names the bad key

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, root_rank: int = 0) -> None:
        """MXNet's ``broadcast(key, value, out)``: rank 0's ``value`` into every rank's ``out``.
        Also the MPI proposal's ``broadcast(key, value, root_rank)``: rank ``root_rank``'s
        ``value`` into every rank's ``value`` (an int third argument is the root)."""
        if isinstance(out, (int, np.integer)) and not isinstance(out, bool):
            out, root_rank = None, int(out)
        self.init(key, value, root_rank=root_rank)
        self.pull(key, out=value if out is None else out, priority=priority)

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        self._engine.settle()
        self._opt.forward_changes()
        self._reap()
        with self._errors(key):
            self._pending.append((self._kv.push(self._keyed(key), push_values(value), priority), value))

    def _reap(self) -> None:
        """Surface errors of finished pushes without waiting for the others."""
        done = [entry for entry in self._pending if entry[0].done]
        if done:
            self._pending = [entry for entry in self._pending if not entry[0].done]
            for handle, _ in done:
                handle.wait()

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> None:
        if out is None:
            raise ValueError(f"pull of key {key!r} needs out=")
        self._engine.settle()
        if not ignore_sparse and any(getattr(o, "stype", "default") != "default" for o in flatten(out)):
            raise mx.base.MXNetError(f"pull of key {key!r} into a row_sparse array with ignore_sparse=False: "
                                     "use row_sparse_pull(key, out, row_ids)")
        with self._errors(key):             # row_sparse outs are left alone (ignore_sparse, as MXNet)
            self._kv.pull(self._keyed(key), out=to_numpy(out, write=True), priority=priority)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """Push gradients, write the new values into ``out`` (into ``value`` if None).

        Gradients go out of the NDArrays' own memory and pulled values come back into it
        (in sync mode a chunk's reply comes only after the server has every worker's push of
        that chunk, so the chunk has left this array by then); for one
        dense CPU array it runs as an operation of MXNet's engine, which may stage the
        values of convolution weights first (see ``EnginePushpulls.start``).
        """
        self._engine.raise_error()
        self._opt.forward_changes()
        targets = value if out is None else out
        if is_sparse(value):                 # rows go up; the pull fills the dense outputs
            self.push(key, value, priority)
            self.pull(key, out=targets, priority=priority)
            return
        moved = self._keyed(key)
        if self._engine.start(moved, value, targets, priority):
            return
        self._engine.settle()
        if self._defer:        # started when the step's loop ends, last parameter first
            self._queued.append((moved, value, targets, priority))
            return
        with self._errors(key):
            self._kv.pushpull(moved, to_numpy(value), out=to_numpy(targets, write=True), priority=priority,
                              block=False).wait()

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> None:
        """Pull rows ``row_ids`` into row_sparse ``out``: only those rows travel, each once
        and in increasing order (MXNet's result for repeated ids). One ``row_ids`` per
        output, or one for all; a list of keys takes a list of each."""
        if out is None or row_ids is None:
            raise ValueError("row_sparse_pull needs out and row_ids")
        self._engine.settle()
        many = isinstance(key, (list, tuple))
        for k, outs, ids in zip(key if many else [key], out if many else [out], row_ids if many else [row_ids]):
            outs, ids = as_list(outs), as_list(ids)
            if len(ids) == 1:
                ids = ids * len(outs)
            if len(ids) != len(outs):
                raise ValueError(f"row_sparse_pull of key {k!r}: {len(outs)} outputs but {len(ids)} row_ids")
            for o, rid in zip(outs, ids):
                if getattr(o, "stype", "default") != "row_sparse":
                    raise mx.base.MXNetError(f"row_sparse_pull of key {k!r}: out must be a row_sparse "
                                             f"NDArray, got stype {getattr(o, 'stype', type(o).__name__)!r}")
                with self._errors(k):
                    got = self._kv.row_sparse_pull(self._keyed(k), rid.asnumpy() if hasattr(rid, "asnumpy") else rid)
                with mx.autograd.pause():    # Gluon pulls inside record(); MXNet's C++ pull is not an op
                    mx.nd.sparse.row_sparse_array((got.values, got.rows), shape=o.shape, ctx=o.context,
                                                  dtype=o.dtype).copyto(o)

    def _at_exit(self) -> None:
        """Before the shared KVStore closes (atexit runs this first): see EnginePushpulls.at_exit."""
        try:
            self._engine.at_exit(self._kv.config.request_timeout or CLOSE_WAIT)
        except Exception as exc:  # noqa: BLE001 - at exit: report, do not raise
            logger.error("at exit: %s", exc)
            _failed_at_exit.append(str(exc))

    def settle_engine(self, raise_errors: bool = True) -> None:
        """Wait for this store's pushpulls in MXNet's engine, at most PS_REQUEST_TIMEOUT (a
        fork must not start with one in flight: hooks.settle_before_fork)."""
        self._engine.settle(timeout=self._kv.config.request_timeout or CLOSE_WAIT, raise_errors=raise_errors)

    def raise_engine_error(self) -> None:
        """Raise the error a pushpull met in MXNet's engine, if one did (``mx.nd.waitall``)."""
        self._engine.raise_error()

    @property
    def engine_ops(self) -> int:
        """How many pushpulls ran as operations of MXNet's engine (tests, stats)."""
        return self._engine.ops

    @contextlib.contextmanager
    def defer_pushpulls(self) -> Iterator[None]:
        """Inside a Trainer step (hooks.patch_trainer): send every parameter's pushpull, then
        wait once."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
            if not self._defer:
                queued, self._queued = self._queued, []
                # Gluon lists parameters input first, but backward finishes the last layers
                # first: taking them in reverse, each waits only for its own gradient and its
                # traffic overlaps the rest of the backward pass.
                for key, value, targets, priority in reversed(queued):
                    handle = self._kv.pushpull(key, to_numpy(value), out=to_numpy(targets, write=True),
                                               priority=priority, block=False)
                    self._pending.append((handle, (value, targets)))
                self._wait_pending()

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, []
        for handle, _ in pending:
            handle.wait()

    # -- optimizer, compression, states ----------------------------------------------------
    def set_optimizer(self, optimizer: Any) -> None:
        """Translate an ``mx.optimizer.Optimizer`` into ps's numpy optimizer on the servers
        (:meth:`ServerOptimizer.set`)."""
        self._opt.set(optimizer, self._claim, self._keyed)
        self._updater = types.SimpleNamespace(optimizer=optimizer)

    def _set_updater(self, updater: Any) -> None:
        raise mx.base.MXNetError(f"{self._TYPE} on ps updates on the servers: use set_optimizer "
                                 "(a worker-side updater would see only this worker's gradients)")

    def _send_command_to_servers(self, head: int, body: str) -> None:
        """How MXNet's own ``set_optimizer`` reaches its servers: see optimizer_in_command."""
        self.set_optimizer(optimizer_in_command(head, body))

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        params = dict(compression_params)
        _same_compression(self, params)
        self._kv.set_gradient_compression(params)
        self._compression = params

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Save the servers' optimizer states (MXNet 1.9 raises here for dist stores)."""
        self._engine.settle()
        self._wait_pending()
        save_states(self._kv, fname, self._namespace)

    def load_optimizer_states(self, fname: str) -> None:
        self._engine.settle()
        load_states(self._kv, fname, self._namespace)

    @property
    def _namespace(self) -> int:
        """Its namespace, 0 until it takes one (see _claim)."""
        return self._ns or 0

    def _barrier(self) -> None:
        self._engine.settle()
        self._wait_pending()
        self._kv.barrier()

    def close(self) -> None:
        try:
            self.settle_engine()
        finally:
            self._kv.close()


def push_values(value: Any) -> Any:
    """What a push sends: row_sparse NDArrays as ``ps.RowSparse`` (their rows only), dense
    ones as :func:`to_numpy` views."""
    if isinstance(value, (list, tuple)):
        return [push_values(v) for v in value]
    if getattr(value, "stype", "default") == "row_sparse":
        return RowSparse(value.indices.asnumpy().astype(np.int64), value.data.asnumpy())
    return to_numpy(value)


def _same_compression(store: PSKVStore, params: dict[str, Any] | None) -> None:
    """Gradient compression is one per process (the ps worker's and the servers'): refuse a
    store whose compression differs from another live store's, which would otherwise have
    its gradients compressed, or not, behind its back (a GAN's two Trainers)."""
    for other in list(_claimed):
        if other is not store and other._compression != params:
            raise ValueError(f"this kvstore asks for gradient compression {params}, another kvstore of this "
                             f"process for {other._compression}: ps compresses every store of a process "
                             "alike; give every Trainer the same compression_params (or none)")


def ps_type(name: str) -> str:
    """The ps store for an MXNet kvstore name. MXNet's C++ ``KVStore::Create`` makes a
    distributed store of any name containing "dist", asynchronous if it also contains
    "_async" (``dist``, ``dist_device_async``, ... included); ps follows the same reading."""
    return ("dist_async" if "_async" in name else "dist_sync") + ("_device" if "device" in name else "")


def store_class(name: str) -> type:
    """The class MXNet's registry keeps for kvstore ``name``: a :class:`PSKVStore` whose
    ``type`` is that name (MXNet instantiates it with no arguments)."""
    return type(name.title(), (PSKVStore,), {"_TYPE": name, "__module__": "ps.mxnet",
                                             "__doc__": f"ps-backed MXNet kvstore {name!r}."})


def live_stores() -> list[PSKVStore]:
    """This process's stores that are still referenced."""
    return list(_live_stores)


def failed_at_exit() -> list[str]:
    """The errors stores found at exit that the script never saw (see PSKVStore._at_exit)."""
    return _failed_at_exit
