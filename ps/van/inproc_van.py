"""In-process transport: queues between vans of one process, for whole-cluster unit tests.

It goes through the real ``encode``/``decode`` so tests exercise the wire format, and
copies array frames on send so that no node ever shares memory with another.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Callable

import numpy as np

from ..errors import ProtocolError, TransportError
from ..message import Message, decode, encode, node_name
from .base import OnMessage, Van

logger = logging.getLogger(__name__)

_registry: dict[str, "InprocVan"] = {}
_registry_lock = threading.Lock()
_counter = itertools.count(1)


class InprocVan(Van):
    def __init__(self, verbose: int = 0, drop: Callable[[Message], bool] | None = None, **_ignored):
        self._verbose = verbose
        self._drop = drop
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._peers: dict[int, str] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._on_message: OnMessage | None = None

    def start(self, on_message: OnMessage, host: str, port: int = 0,
              port_range: tuple[int, int] | None = None, name: str = "") -> str:
        with _registry_lock:
            if not port:
                port = 20000 + next(_counter)
            self.address = f"inproc://{host}:{port}"
            if self.address in _registry:
                raise TransportError(f"cannot bind {self.address}: address in use")
            _registry[self.address] = self
        self._on_message = on_message
        self._thread = threading.Thread(target=self._loop, name=f"ps-inproc[{name or self.address}]",
                                        daemon=True)
        self._thread.start()
        return self.address

    def endpoint(self, host: str, port: int) -> str:
        return f"inproc://{host}:{port}"

    @property
    def identity(self) -> bytes:
        return self.address.encode()

    @property
    def in_io_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def connect(self, node_id: int, address: str) -> None:
        self._peers[node_id] = address

    def call_soon(self, fn: Callable[[], None]) -> None:
        if self.in_io_thread:
            fn()
        elif self._stopping:
            raise TransportError("the van is not running")
        else:
            self._inbox.put((fn, (None, 0)))

    def call_later(self, fn: Callable[[], None]) -> None:
        if self._stopping:
            raise TransportError("the van is not running")
        self._inbox.put((fn, (None, 0)))

    def send(self, msg: Message) -> None:
        if self._stopping:
            raise TransportError("the van is not running")
        frames = [f if isinstance(f, bytes) else np.array(f, copy=True).tobytes() for f in encode(msg)]
        if msg.on_sent is not None:
            msg.on_sent(None)               # copied: the sender may change its arrays now
        if msg.route is not None:
            target, route = _registry.get(msg.route.decode()), None
        else:
            target, route = _registry.get(self._peers.get(msg.recver, "")), self.identity
        if target is None or target._stopping:
            logger.warning("dropping %r: %s is not reachable", msg, node_name(msg.recver))
            return
        source = 0 if route is not None else next(
            (i for i, a in target._peers.items() if a == self.address), 0)
        target._inbox.put((frames, (route, source)))

    def _loop(self) -> None:
        while not self._stopping:
            try:
                frames, (route, source) = self._inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if callable(frames):
                frames()
                continue
            try:
                msg = decode(frames, route)
                msg.source = source
            except ProtocolError as exc:
                logger.warning("%s: dropped a malformed message: %s", self.address, exc)
                continue
            if self._drop is not None and self._drop(msg):
                continue
            try:
                self._on_message(msg)
            except Exception:  # noqa: BLE001
                logger.exception("error handling %r", msg)

    def stop(self, linger: float = 0.0, timeout: float = 5.0) -> None:
        if self._thread is None or self._stopping:
            return
        self._stopping = True
        with _registry_lock:
            _registry.pop(self.address, None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
