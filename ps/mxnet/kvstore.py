"""``PSKVStore``: a ps worker behind MXNet's kvstore interface, and its registration."""
from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import itertools
import logging
import numbers
import os
import pickle
import sys
import types
import weakref
from typing import Any, Callable, Iterator

import msgpack
import mxnet as mx
import numpy as np

from ..kvstore import CLOSE_WAIT, KVStore, RowSparse
from .arrays import as_list, first, flatten, is_sparse, to_numpy
from .engine_ops import EnginePushpulls, mx_waitall

logger = logging.getLogger(__name__)

STATES_FORMAT = "ps-optimizer-states"
_shared: KVStore | None = None
_live_stores: "weakref.WeakSet[PSKVStore]" = weakref.WeakSet()
_namespaces = itertools.count()     # handed out in the order stores first init or set an optimizer
_claimed: "weakref.WeakSet[PSKVStore]" = weakref.WeakSet()     # the stores that took one
NS_SHIFT = 50                       # a second store's int key k travels as ns << NS_SHIFT | k
_failed_at_exit: list[str] = []     # what a store found at exit that the script never saw


def shared_store() -> KVStore | None:
    """This process's ps worker, if a kvstore made one and it is open."""
    return _shared if _shared is not None and not _shared.closed else None


def _store(kvtype: str) -> KVStore:
    """One ps worker per process: every registered kvstore instance shares it."""
    global _shared
    if _shared is None or _shared.closed:
        _shared = KVStore(kvtype)
    elif ("async" in _shared.type) != ("async" in kvtype):
        raise ValueError(f"this process already joined the cluster as {_shared.type!r}; "
                         f"cannot also create {kvtype!r}")
    return _shared


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
        self._kv = _store(ps_type(self._TYPE))
        self._ns: int | None = None         # its namespace on the servers: see _claim
        self._compression: dict[str, Any] | None = None    # what this store asked for
        self._updater: Any = None           # Trainer.load_states reads ._updater.optimizer
        self._optimizer: Any = None
        self._sent: dict[str, float] = {}
        self._defer = 0
        self._pending: list[tuple[Any, Any]] = []   # (handle, the arrays it reads/writes: kept alive)
        self._queued: list[tuple[Any, Any, Any, int]] = []
        self._engine = EnginePushpulls(self._kv)
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
    def init(self, key: Any, value: Any) -> None:
        self._engine.settle()
        ns = self._claim()
        keys = self._keyed(key)
        taken = [k for k, moved in zip(as_list(key), as_list(keys))
                 if _is_int(k) and self._kv.key_info(moved) is not None]
        if taken:
            raise ValueError(
                f"key {taken[0]} is already initialized in this kvstore: a gluon.Trainer numbers its "
                "parameters 0, 1, ..., so two Trainers given the same kvstore object reuse each other's "
                "keys (MXNet's own dist kvstore hangs there). Give each Trainer its own store "
                "(kvstore='dist_sync', or one mx.kv.create each: ps keeps their keys and optimizers "
                "apart), or put every parameter in one Trainer (docs/mxnet.md)")
        self._kv.init(keys, first(to_numpy(value), key),
                      labels=[self._label(k) for k in as_list(key)] if ns else None)
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
        if _is_int(key):                    # numpy's too, as MXNet takes them
            if not 0 <= key < 1 << NS_SHIFT:
                raise ValueError(f"key {key}: a second kvstore of a process takes int keys in [0, 2**{NS_SHIFT})")
            return ns << NS_SHIFT | int(key)
        return key                          # the store names the bad key

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        self.init(key, value)
        self.pull(key, out=out, priority=priority)

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        self._engine.settle()
        self._sync_optimizer_params()
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
        self._sync_optimizer_params()
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

    @property
    def engine_ops(self) -> int:
        """How many pushpulls ran as operations of MXNet's engine (tests, stats)."""
        return self._engine.ops

    @contextlib.contextmanager
    def _deferred(self) -> Iterator[None]:
        """Inside a Trainer step: send every parameter's pushpull, then wait once."""
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
        """Translate an ``mx.optimizer.Optimizer`` into ps's numpy optimizer on the servers."""
        from ..optim.from_mxnet import spec_from_mxnet
        try:
            spec = spec_from_mxnet(optimizer)
        except ValueError as unknown:
            self._set_pickled(optimizer, unknown)
            return
        ns = self._claim()
        key_of = self._index_keys(optimizer)
        for name in ("lr_mult", "wd_mult"):
            if spec["params"].get(name):       # resolved per parameter index
                spec["params"][name] = {key_of(k): v for k, v in spec["params"][name].items()}
        self._kv.set_optimizer(spec, namespace=ns)
        self._optimizer = optimizer
        self._updater = types.SimpleNamespace(optimizer=optimizer)
        self._sent = {"lr": optimizer.lr, "rescale_grad": optimizer.rescale_grad}

    def _set_pickled(self, optimizer: Any, unknown: ValueError) -> None:
        """No numpy version: run MXNet's own optimizer on the servers, pickled by value
        (cloudpickle: a class defined in the script itself travels too) and HMAC-signed with
        the job's key (PS_SECRET_FILE, else PS_JOB_KEY_FILE, which the launcher writes per job
        on one machine); servers check the signature before unpickling."""
        try:
            import cloudpickle
        except ImportError:
            raise ValueError(f"{unknown}. Running MXNet's own optimizer on the servers needs cloudpickle "
                             "(pip install 'ps[mxnet]' or pip install cloudpickle)") from None

        from .. import _security
        from ..errors import RemoteError
        from ..optim import pickled
        cfg = self._kv.config
        key = _security.signing_key(cfg.secret_file, cfg.job_key_file)
        if key is None:
            raise ValueError(f"{unknown}. MXNet's own optimizer runs on the servers only signed with the "
                             f"job's key: {_security.NO_KEY}") from None
        ns = self._claim()                          # before the keys are mapped: they move with it
        payload = cloudpickle.dumps(self._as_servers_call_it(optimizer))
        signature = pickled.sign(payload, key)
        try:
            self._kv.set_pickled_optimizer(payload, signature, namespace=ns)
        except RemoteError as refused:
            raise ValueError(f"{unknown}; the servers refused the pickled optimizer: {refused}") from None
        self._optimizer = optimizer
        self._updater = types.SimpleNamespace(optimizer=optimizer)
        self._sent = {"lr": optimizer.lr, "rescale_grad": optimizer.rescale_grad}

    def _index_keys(self, optimizer: Any) -> Callable[[Any], Any]:
        """How this store keys the parameter an optimizer knows by ``index``: Module's keys
        are the names its ``idx2name`` gives (str keys), a Trainer's the indices; a second
        store's keys are moved (``_keyed``). A name is left as it is."""
        idx2name = getattr(optimizer, "idx2name", None) or {}
        by_name = bool(idx2name) and self._kv.key_kind is not int      # Module: str keys are names

        def key_of(index: Any) -> Any:
            if not _is_int(index):
                return index
            return self._keyed(idx2name.get(index, index) if by_name else index)
        return key_of

    def _as_servers_call_it(self, optimizer: Any) -> Any:
        """A copy of ``optimizer`` whose per-index tables use the keys the servers will call
        it with. MXNet's optimizer finds a parameter's lr/wd multipliers by index: through
        ``param_dict`` (Gluon), its own ``lr_mult``/``wd_mult``, then ``idx2name`` (Module,
        where names not ending in ``_weight``/``_gamma`` get no weight decay). On ps a str key
        reaches the servers hashed and a second store's keys moved, so each index is mapped to
        that key; ``param_dict``, which pickling drops, is folded into the dicts first."""
        key_of = self._index_keys(optimizer)

        def server(index: Any) -> Any:          # a name stays a name: it resolves through idx2name
            return self._kv.server_key(key_of(index)) if _is_int(index) else index

        idx2name = getattr(optimizer, "idx2name", None) or {}
        lr_mult = {server(k): v for k, v in optimizer.lr_mult.items()}
        wd_mult = {server(k): v for k, v in optimizer.wd_mult.items()}
        for index, param in getattr(optimizer, "param_dict", {}).items():
            lr_mult[server(index)] = param.lr_mult
            wd_mult[server(index)] = param.wd_mult
        sent = copy.copy(optimizer)                 # MXNet's own state rules: param_dict left out
        sent.idx2name = {server(i): name for i, name in idx2name.items()}
        sent.lr_mult, sent.wd_mult = lr_mult, wd_mult
        return sent

    def _sync_optimizer_params(self) -> None:
        """Trainer.set_learning_rate / a new batch size change the local optimizer only;
        rank 0 forwards the change to the servers before its next push."""
        opt = self._optimizer
        if opt is None or self.rank != 0:
            return
        changed = {}
        if opt.lr != self._sent.get("lr") and getattr(opt, "lr_scheduler", None) is None:
            changed["learning_rate"] = self._sent["lr"] = opt.lr
        if opt.rescale_grad != self._sent.get("rescale_grad"):
            changed["rescale_grad"] = self._sent["rescale_grad"] = opt.rescale_grad
        if changed:
            self._engine.settle()        # earlier steps' pushes still use the old values
            self._kv.server_command("set_params", changed, namespace=self._namespace)

    def _set_updater(self, updater: Any) -> None:
        raise mx.base.MXNetError(f"{self._TYPE} on ps updates on the servers: use set_optimizer "
                                 "(a worker-side updater would see only this worker's gradients)")

    def _send_command_to_servers(self, head: int, body: str) -> None:
        """Head 0 is how MXNet's own ``set_optimizer`` reaches its servers (a pickled optimizer);
        the script's own bytes are unpickled here, in its own process, never on a server."""
        if head == 0:
            try:
                optimizer = pickle.loads(body.encode("latin-1") if isinstance(body, str) else body)
            except Exception as exc:  # noqa: BLE001 - any unpickling failure: name the command
                raise mx.base.MXNetError(f"server command 0 (set the optimizer) needs a pickled "
                                         f"mx.optimizer.Optimizer as its body; unpickling {body[:40]!r} "
                                         f"failed: {type(exc).__name__}: {exc}") from None
            if not isinstance(optimizer, mx.optimizer.Optimizer):
                raise mx.base.MXNetError(f"server command 0 (set the optimizer) needs a pickled "
                                         f"mx.optimizer.Optimizer, got {type(optimizer).__name__}")
            self.set_optimizer(optimizer)
            return
        raise mx.base.MXNetError(f"ps servers take no MXNet server command {head!r} but 0 (set the "
                                 "optimizer; use kv.set_optimizer); server profiling goes through "
                                 "mx.profiler.set_config/set_state(profile_process='server')")

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        params = dict(compression_params)
        _same_compression(self, params)
        self._kv.set_gradient_compression(params)
        self._compression = params

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Save the servers' optimizer states (MXNet 1.9 raises here for dist stores)."""
        self._engine.settle()
        self._wait_pending()
        states = self._kv.server_command("get_states", namespace=self._namespace)
        blob = {"format": STATES_FORMAT, "version": 1, "num_servers": self._kv.num_servers,
                "namespace": self._namespace, "servers": {str(sid): data for sid, data in states.items()}}
        with open(fname, "wb") as f:
            f.write(msgpack.packb(blob, use_bin_type=True))

    def load_optimizer_states(self, fname: str) -> None:
        self._engine.settle()
        with open(fname, "rb") as f:
            blob = msgpack.unpackb(f.read(), raw=False)
        if not isinstance(blob, dict) or blob.get("format") != STATES_FORMAT:
            raise ValueError(f"{fname} is not a ps optimizer-states file (saved by save_optimizer_states)")
        if blob["num_servers"] != self._kv.num_servers:
            raise ValueError(f"{fname} holds states of {blob['num_servers']} servers; this job has "
                             f"{self._kv.num_servers}")
        saved = blob.get("namespace", 0)
        if saved != self._namespace:
            raise ValueError(f"{fname} holds the states of this process's kvstore number {saved + 1} (in the "
                             "order the stores first initialized keys or set an optimizer), and this is number "
                             f"{self._namespace + 1}: load each Trainer's states after the Trainers' first "
                             "steps, or create and first use the stores in the order of the run that saved them")
        for sid, data in blob["servers"].items():
            self._kv.server_command("set_states", {"states": data}, servers=[int(sid)], namespace=self._namespace)

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
            self._engine.settle(timeout=self._kv.config.request_timeout or CLOSE_WAIT)
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


def settle_before_fork() -> None:
    """MXNet's own fork handler waits for every engine operation to finish, and it runs while
    the forking thread holds the GIL, which ps's I/O thread needs to finish ours: a fork with
    a pushpull in the engine (a DataLoader starting its worker processes) would hang. So
    let them finish first; waiting here releases the GIL."""
    for store in list(_live_stores):
        try:
            store._engine.settle(timeout=store._kv.config.request_timeout or CLOSE_WAIT, raise_errors=False)
        except Exception as exc:  # noqa: BLE001 - a fork must go on; say why it may stall
            logger.error("before fork: %s", exc)


def _same_compression(store: PSKVStore, params: dict[str, Any] | None) -> None:
    """Gradient compression is one per process (the ps worker's and the servers'): refuse a
    store whose compression differs from another live store's, which would otherwise have
    its gradients compressed, or not, behind its back (a GAN's two Trainers)."""
    for other in list(_claimed):
        if other is not store and other._compression != params:
            raise ValueError(f"this kvstore asks for gradient compression {params}, another kvstore of this "
                             f"process for {other._compression}: ps compresses every store of a process "
                             "alike; give every Trainer the same compression_params (or none)")


def _is_int(key: Any) -> bool:
    return isinstance(key, numbers.Integral) and not isinstance(key, bool)


def ps_type(name: str) -> str:
    """The ps store for an MXNet kvstore name. MXNet's C++ ``KVStore::Create`` makes a
    distributed store of any name containing "dist", asynchronous if it also contains
    "_async" (``dist``, ``dist_device_async``, ... included); ps follows the same reading."""
    return ("dist_async" if "_async" in name else "dist_sync") + ("_device" if "device" in name else "")


def _kvstore_class(name: str) -> type:
    cls = type(name.title(), (PSKVStore,), {"_TYPE": name, "__module__": "ps.mxnet",
                                            "__doc__": f"ps-backed MXNet kvstore {name!r}."})
    mx.kvstore.KVStoreBase.register(cls)
    return cls


def register() -> dict[str, type]:
    """Register ps's kvstores with MXNet (``mx.kv.create`` and Trainer look there first)."""
    classes = {}
    for name in ("dist_sync", "dist_async", "dist_sync_device", "dist_device_sync",
                 "dist_async_device", "dist"):
        cls = _kvstore_class(name)
        classes[cls.__name__] = cls
    return classes


def patch_create() -> None:
    """MXNet's ``create`` looks its registry up by exact name and passes any other name to its
    C++ ``KVStore::Create``, which makes a ps-lite store of every name containing "dist":
    without this, ``kvstore='dist_device_async'`` would start MXNet's own ps-lite worker
    against ps's scheduler. Such a name gets a ps store of its own (registered on first use)."""
    original = mx.kvstore.base.create
    if getattr(original, "_ps_patched", False):
        return

    @functools.wraps(original)
    def create(name: Any = "local") -> Any:
        if isinstance(name, str):
            lower = name.lower()
            if "dist" in lower and lower not in mx.kvstore.KVStoreBase.kv_registry:
                _kvstore_class(lower)
        return original(name)

    create._ps_patched = True  # type: ignore[attr-defined]
    mx.kvstore.base.create = create
    mx.kvstore.create = create


def patch_waitall() -> None:
    """Native MXNet raises a failed engine operation's error at ``mx.nd.waitall()``. A
    pushpull ps ran in the engine does not hand MXNet its error (the completion callback takes
    a C++ ``dmlc::Error``; docs/mxnet.md says why not), so after MXNet's wait the error is
    raised here, as MXNet would, besides at the store's next call: a script that queues its
    steps and then waits would otherwise finish on weights its failed pushpulls never updated."""
    if getattr(mx.nd.waitall, "_ps_patched", False):
        return

    @functools.wraps(mx_waitall)
    def waitall() -> None:
        mx_waitall()
        for store in list(_live_stores):
            store._engine.raise_error()
    waitall._ps_patched = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):      # mx.nd, mx.npx and the modules that import it
        if (name == "mxnet" or name.startswith("mxnet.")) and getattr(module, "waitall", None) is mx_waitall:
            module.waitall = waitall


def exit_status() -> None:
    """At exit, after the stores closed (registered before any, and by the autoload hook at
    start-up: after every exit handler): a pushpull that failed where the script never saw it
    (its last steps, queued in MXNet's engine) makes the process exit 1, not 0, so the
    launcher and the job report it. A script that died of an uncaught exception exits 1
    already (``sys.last_value``): nothing to change."""
    if not _failed_at_exit or getattr(sys, "last_value", None) is not None:
        return
    logger.error("exiting with status 1: %d pushpull error(s) the script never saw (above)", len(_failed_at_exit))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)


def patch_trainer() -> None:
    """A Trainer step sends every parameter's pushpull first and waits once at the end,
    instead of one blocking round trip per parameter."""
    trainer_cls = mx.gluon.Trainer
    original = trainer_cls._allreduce_grads
    if getattr(original, "_ps_patched", False):
        return

    def _allreduce_grads(self: Any) -> None:
        kv = self._kvstore
        if isinstance(kv, PSKVStore):
            with kv._deferred():
                original(self)
        else:
            original(self)
    _allreduce_grads._ps_patched = True
    trainer_cls._allreduce_grads = _allreduce_grads


