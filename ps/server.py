"""The server role: decode requests, let the Store decide, send what it returns.

Handlers run on the van's I/O thread, so replies leave without a thread hop. Values
go out zero-copy; a :class:`BufferGuard` remembers which arrays ZeroMQ still reads so
the store copies before changing them in place.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from . import compression, optim
from .config import Config
from .errors import PSError
from .keys import CHUNK_BYTES
from .message import Command, Message, entry_has_data, node_name
from .postoffice import SCHEDULER, Postoffice
from .store import Reply, Store
from .van import Van

logger = logging.getLogger(__name__)

PRUNE_AT = 16           # BufferGuard entries before finished ones are dropped
SETTLE_WAIT = 0.005     # seconds busy() waits for lagging trackers before saying "busy"
ZERO_COPY_MIN = 65536   # pyzmq copies smaller frames anyway: no need to track them


class BufferGuard:
    """Tracks arrays that ZeroMQ may still be reading (zero-copy sends in flight)."""

    def __init__(self) -> None:
        self._inflight: dict[int, list] = {}   # id(base) -> [base, tracker, ...]

    def mark(self, bases: list[np.ndarray], tracker: Any) -> None:
        if len(self._inflight) > PRUNE_AT:    # entries pin their arrays: drop finished ones early
            for key in [k for k, v in self._inflight.items() if all(t.done for t in v[1:])]:
                del self._inflight[key]
        for base in bases:
            self._inflight.setdefault(id(base), [base]).append(tracker)

    def busy(self, array: np.ndarray, wait: float = SETTLE_WAIT) -> bool:
        """True while a zero-copy send may still read ``array``.

        pyzmq marks a tracker done from its garbage-collector *thread*, which needs the GIL
        this I/O thread holds, so trackers lag behind the real sends: wait for them briefly
        (releasing the GIL) before answering True and making the caller copy a large array.
        """
        entry = self._inflight.get(id(array))
        if entry is None:
            return False
        live = [t for t in entry[1:] if not t.done]
        if live and wait > 0:
            end = time.monotonic() + wait
            for t in live:
                try:
                    t.wait(max(0.0, end - time.monotonic()))
                except Exception:  # noqa: BLE001 - zmq.NotDone: still in flight
                    break
            live = [t for t in live if not t.done]
        if live:
            entry[1:] = live
            return True
        del self._inflight[id(array)]
        return False


class KVServer:
    """``KVServer(config).run()`` serves until the job ends; returns the exit code."""

    def __init__(self, config: Config, van: Van | None = None):
        self.po = Postoffice(config, van)
        self.guard = BufferGuard()
        self.store: Store | None = None
        self.error: PSError | None = None
        self._routes: dict[int, bytes | None] = {}
        self._stopped = threading.Event()
        self._joined = threading.Event()
        self.po.on(Command.DATA, self._on_data)
        self.po.on(Command.SERVER_CMD, self._on_command)
        self.po.on(Command.WORKER_CLOSED, self._on_worker_closed)
        self.po.on(Command.TERMINATE, self._on_terminate)
        self.po.add_failure_listener(self._on_failure)

    def start(self) -> None:
        self.po.start()
        self._joined.set()

    def run(self) -> int:
        try:
            if not self._joined.is_set():
                self.start()
            while not self._stopped.wait(0.5):
                pass
        except PSError as exc:
            self.error = exc
        finally:
            self.po.close(linger=1.0)
        if self.error is not None:
            logger.error("%s exits: %s", self.po, self.error)
            return 1
        return 0

    def stop(self) -> None:
        self._stopped.set()

    @property
    def name(self) -> str:
        return f"server {self.po.rank} ({node_name(self.po.node_id)})"

    def _store(self) -> Store:
        if self.store is None:   # created on first use: the sync mode comes with the node table
            self.store = Store(self.po.num_workers, self.po.sync, self.name, busy=self.guard.busy)
        return self.store

    # -- data ----------------------------------------------------------------------------
    def _on_data(self, msg: Message) -> None:
        if not msg.request:
            return
        self._routes[msg.sender] = msg.route
        store = self._store()
        replies: list[Reply] = []
        arrays = iter(msg.frames)
        for entry in msg.body:
            data = next(arrays) if entry_has_data(True, entry[1], None) else None
            replies += store.handle(msg.sender, entry, data)
        if replies:
            self._send(replies)
            store.replies_sent()

    def _send(self, replies: list[Reply]) -> None:
        """Group replies per worker into messages of about CHUNK_BYTES each."""
        batches: dict[int, tuple[list, list, list, list]] = {}
        for dest, entry, data in replies:
            entries, frames, bases, size = batches.setdefault(dest, ([], [], [], [0]))
            entries.append(entry)
            if data is not None:
                frames.append(data)
                size[0] += data.nbytes
                if data.nbytes >= ZERO_COPY_MIN:
                    bases.append(data.base if data.base is not None else data)
                if size[0] >= CHUNK_BYTES:
                    self._emit(dest, entries, frames, bases)
                    batches.pop(dest)
        for dest, (entries, frames, bases, _) in batches.items():
            self._emit(dest, entries, frames, bases)

    def _emit(self, dest: int, entries: list, frames: list, bases: list) -> None:
        msg = Message(Command.DATA, self.po.node_id, dest, entries, frames, request=False,
                      route=self._routes.get(dest))
        if bases:
            msg.on_sent = lambda tracker, b=bases: self.guard.mark(b, tracker)
        self.po.van.send(msg)

    # -- commands ------------------------------------------------------------------------
    def _on_command(self, msg: Message) -> None:
        body = msg.body if isinstance(msg.body, dict) else {}
        reply: dict[str, Any] = {"id": body.get("id")}
        try:
            reply["result"] = self._run_command(body.get("cmd"), body)
        except Exception as exc:  # noqa: BLE001 - reported to the worker, server goes on
            reply["error"] = [type(exc).__name__, f"{self.name}: {exc}"]
        self.po.van.send(Message(Command.SERVER_CMD, self.po.node_id, msg.sender, reply,
                                 request=False, route=msg.route))

    def _run_command(self, cmd: str | None, body: dict[str, Any]) -> Any:
        store = self._store()
        if cmd == "set_optimizer":
            opt = optim.from_spec(body["spec"])
            store.set_updater(optim.Updater(opt), getattr(opt, "multi_precision", False))
            return None
        if cmd == "set_optimizer_pickle":
            cfg = self.po.config
            if not cfg.allow_pickle:
                raise PermissionError("this server does not accept pickled optimizers; start the servers "
                                      "with PS_ALLOW_PICKLE=1 and PS_SECRET_FILE (trusted clusters only)")
            if not cfg.secret_file:
                raise PermissionError("PS_ALLOW_PICKLE=1 needs PS_SECRET_FILE: pickles are accepted only "
                                      "from an authenticated cluster")
            from . import _pickled, _security
            key = _security.hmac_key(_security.read_secret(cfg.secret_file))
            opt = _pickled.load_optimizer(body["payload"], body["signature"], key)
            store.set_updater(_pickled.MXNetUpdater(opt), bool(getattr(opt, "multi_precision", False)))
            return None
        if cmd == "set_params":
            opt = self._optimizer(store)
            if "learning_rate" in body:
                setter = getattr(opt, "set_learning_rate", None)
                setter(body["learning_rate"]) if setter else setattr(opt, "lr", float(body["learning_rate"]))
            if "rescale_grad" in body:
                opt.rescale_grad = float(body["rescale_grad"])
            return None
        if cmd == "get_states":
            return self._updater(store).get_states()
        if cmd == "set_states":
            self._updater(store).set_states(body["states"])
            return None
        if cmd == "set_compression":
            store.compression = compression.parse(body["params"])
            return None
        if cmd == "stats":
            return store.stats()
        raise ValueError(f"unknown server command {cmd!r}")

    @staticmethod
    def _updater(store: Store) -> optim.Updater:
        if not hasattr(store.updater, "get_states"):
            raise RuntimeError("no optimizer is set on the servers (kv.set_optimizer)")
        return store.updater

    def _optimizer(self, store: Store) -> optim.Optimizer:
        return self._updater(store).optimizer

    # -- lifecycle messages ---------------------------------------------------------------
    def _on_worker_closed(self, msg: Message) -> None:
        replies = self._store().worker_closed(msg.body["id"])
        if replies:
            self._send(replies)

    def _on_terminate(self, msg: Message) -> None:
        self.po.van.send(Message(Command.TERMINATE, self.po.node_id, SCHEDULER, request=False,
                                 route=msg.route))
        self._stopped.set()

    def _on_failure(self, exc: PSError) -> None:
        self.error = exc
        self._stopped.set()
