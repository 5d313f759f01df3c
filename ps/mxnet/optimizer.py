"""The optimizer a ``PSKVStore``'s servers run, and the files its states are saved in.

MXNet's dist kvstore pickles its optimizer to C++ servers that run MXNet; ps's servers run
numpy optimizers (ps/optim), so the script's ``mx.optimizer.Optimizer`` is translated here,
on the worker, which alone knows how the optimizer's per-index tables map to the keys the
servers see. What has no numpy version travels pickled, signed with the job's key.
"""
from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import msgpack
import mxnet as mx

from ..kvstore import KVStore
from .arrays import is_int_key
from .engine_ops import EnginePushpulls

STATES_FORMAT = "ps-optimizer-states"


class ServerOptimizer:
    """A store's optimizer on the servers, and what rank 0 last told them of it: a Trainer
    changes the learning rate and gradient scale of the worker's copy only."""

    def __init__(self, kv: KVStore, engine: EnginePushpulls) -> None:
        self.kv, self.engine = kv, engine
        self.optimizer: Any = None
        self.namespace = 0                  # the store's: it takes one before its optimizer
        self.sent: dict[str, float] = {}

    def set(self, optimizer: Any, claim: Callable[[], int], keyed: Callable[[Any], Any]) -> None:
        """Translate an ``mx.optimizer.Optimizer`` into ps's numpy optimizer on the servers.
        ``claim`` takes the store's namespace (see ``PSKVStore._claim``), ``keyed`` moves a
        key into it: both only once the optimizer is known to be usable."""
        from ..optim.from_mxnet import spec_from_mxnet
        try:
            spec = spec_from_mxnet(optimizer)
        except ValueError as unknown:
            self._set_pickled(optimizer, unknown, claim, keyed)
            return
        ns = claim()
        key_of = self._index_keys(optimizer, keyed)
        for name in ("lr_mult", "wd_mult"):
            if spec["params"].get(name):       # resolved per parameter index
                spec["params"][name] = {key_of(k): v for k, v in spec["params"][name].items()}
        self.kv.set_optimizer(spec, namespace=ns)
        self._took(optimizer, ns)

    def _set_pickled(self, optimizer: Any, unknown: ValueError, claim: Callable[[], int],
                     keyed: Callable[[Any], Any]) -> None:
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
        cfg = self.kv.config
        key = _security.signing_key(cfg.secret_file, cfg.job_key_file)
        if key is None:
            raise ValueError(f"{unknown}. MXNet's own optimizer runs on the servers only signed with the "
                             f"job's key: {_security.NO_KEY}") from None
        ns = claim()                                # before the keys are mapped: they move with it
        payload = cloudpickle.dumps(self._as_servers_call_it(optimizer, keyed))
        signature = pickled.sign(payload, key)
        try:
            self.kv.set_pickled_optimizer(payload, signature, namespace=ns)
        except RemoteError as refused:
            raise ValueError(f"{unknown}; the servers refused the pickled optimizer: {refused}") from None
        self._took(optimizer, ns)

    def _took(self, optimizer: Any, ns: int) -> None:
        self.optimizer, self.namespace = optimizer, ns
        self.sent = {"lr": optimizer.lr, "rescale_grad": optimizer.rescale_grad}

    def _index_keys(self, optimizer: Any, keyed: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """How the store keys the parameter an optimizer knows by ``index``: Module's keys
        are the names its ``idx2name`` gives (str keys), a Trainer's the indices; a second
        store's keys are moved (``keyed``). A name is left as it is."""
        idx2name = getattr(optimizer, "idx2name", None) or {}
        by_name = bool(idx2name) and self.kv.key_kind is not int      # Module: str keys are names

        def key_of(index: Any) -> Any:
            if not is_int_key(index):
                return index
            return keyed(idx2name.get(index, index) if by_name else index)
        return key_of

    def _as_servers_call_it(self, optimizer: Any, keyed: Callable[[Any], Any]) -> Any:
        """A copy of ``optimizer`` whose per-index tables use the keys the servers will call
        it with. MXNet's optimizer finds a parameter's lr/wd multipliers by index: through
        ``param_dict`` (Gluon), its own ``lr_mult``/``wd_mult``, then ``idx2name`` (Module,
        where names not ending in ``_weight``/``_gamma`` get no weight decay). On ps a str key
        reaches the servers hashed and a second store's keys moved, so each index is mapped to
        that key; ``param_dict``, which pickling drops, is folded into the dicts first."""
        key_of = self._index_keys(optimizer, keyed)

        def server(index: Any) -> Any:          # a name stays a name: it resolves through idx2name
            return self.kv.server_key(key_of(index)) if is_int_key(index) else index

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

    def forward_changes(self) -> None:
        """Trainer.set_learning_rate / a new batch size change the local optimizer only;
        rank 0 forwards the change to the servers before its next push."""
        opt = self.optimizer
        if opt is None or self.kv.rank != 0:
            return
        changed = {}
        if opt.lr != self.sent.get("lr") and getattr(opt, "lr_scheduler", None) is None:
            changed["learning_rate"] = self.sent["lr"] = opt.lr
        if opt.rescale_grad != self.sent.get("rescale_grad"):
            changed["rescale_grad"] = self.sent["rescale_grad"] = opt.rescale_grad
        if changed:
            self.engine.settle()        # earlier steps' pushes still use the old values
            self.kv.server_command("set_params", changed, namespace=self.namespace)


def optimizer_in_command(head: int, body: str | bytes) -> Any:
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
        return optimizer
    raise mx.base.MXNetError(f"ps servers take no MXNet server command {head!r} but 0 (set the "
                             "optimizer; use kv.set_optimizer); server profiling goes through "
                             "mx.profiler.set_config/set_state(profile_process='server')")


def save_states(kv: KVStore, fname: str, namespace: int) -> None:
    """The servers' optimizer states of one store's namespace, in one msgpack file."""
    states = kv.server_command("get_states", namespace=namespace)
    blob = {"format": STATES_FORMAT, "version": 1, "num_servers": kv.num_servers,
            "namespace": namespace, "servers": {str(sid): data for sid, data in states.items()}}
    with open(fname, "wb") as f:
        f.write(msgpack.packb(blob, use_bin_type=True))


def load_states(kv: KVStore, fname: str, namespace: int) -> None:
    """Give each server back its states from a file :func:`save_states` wrote; refuse a file
    whose servers or namespace differ, which would hand states to the wrong keys."""
    with open(fname, "rb") as f:
        blob = msgpack.unpackb(f.read(), raw=False)
    if not isinstance(blob, dict) or blob.get("format") != STATES_FORMAT:
        raise ValueError(f"{fname} is not a ps optimizer-states file (saved by save_optimizer_states)")
    if blob["num_servers"] != kv.num_servers:
        raise ValueError(f"{fname} holds states of {blob['num_servers']} servers; this job has "
                         f"{kv.num_servers}")
    saved = blob.get("namespace", 0)
    if saved != namespace:
        raise ValueError(f"{fname} holds the states of this process's kvstore number {saved + 1} (in the "
                         "order the stores first initialized keys or set an optimizer), and this is number "
                         f"{namespace + 1}: load each Trainer's states after the Trainers' first "
                         "steps, or create and first use the stores in the order of the run that saved them")
    for sid, data in blob["servers"].items():
        kv.server_command("set_states", {"states": data}, servers=[int(sid)], namespace=namespace)
