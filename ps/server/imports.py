"""Imports of seconds (torch for ps.torch.ServerOptimizer's rules, mxnet for a pickled MXNet
optimizer), kept off the server's I/O thread.

On the I/O thread such an import holds back everything the server sends, its heartbeats too,
and the scheduler finds the server silent: a live server was declared dead that way
(PS_HEARTBEAT_TIMEOUT=10, torch loading on a busy machine). So a ``set_optimizer`` that needs one
starts it on a thread of its own, and server commands wait, in order, until it is in (pushes
cannot come meanwhile: their workers wait for the optimizer's answer first).
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Iterable

from .. import optim
from ..message import Message

logger = logging.getLogger(__name__)

WARN_AFTER = 20.0     # seconds an import may hold commands back before the server says so


def load(name: str) -> None:
    """Import ``name``; a failure is left for the optimizer's own import to raise and explain."""
    try:
        if name == "mxnet":
            from ..optim import pickled
            pickled.import_mxnet()          # with DMLC_ROLE hidden, or it would start MXNet's server
        else:
            importlib.import_module(name)
    except Exception:       # noqa: BLE001
        logger.debug("importing %s failed", name, exc_info=True)


class SlowImports:
    """``hold(msg)`` on the I/O thread before a server command runs; ``handle`` runs the
    held commands there once the import is in."""

    def __init__(self, call_soon: Callable[[Callable[[], None]], None], handle: Callable[[Message], None],
                 allow_pickle: bool, warn_after: float = WARN_AFTER, name: Callable[[], str] = lambda: "server"):
        self._call_soon, self._handle, self._allow_pickle = call_soon, handle, allow_pickle
        self._warn_after, self._name = warn_after, name
        self._held: list[Message] | None = None     # commands waiting for the import
        self._tried: set[str] = set()

    def hold(self, msg: Message) -> bool:
        """Whether ``msg`` waits (it runs later, through ``handle``)."""
        if self._held is not None:
            self._held.append(msg)
            return True
        body = msg.body if isinstance(msg.body, dict) else {}
        cmd = body.get("cmd")
        if cmd == "set_optimizer_pickle" and self._allow_pickle:
            needed: Iterable[str] = ("mxnet",)
        elif cmd == "set_optimizer":
            needed = optim.modules_of(body.get("spec"))
        else:
            return False
        missing = tuple(m for m in needed if m not in sys.modules and m not in self._tried)
        if not missing:
            return False
        self._held = [msg]
        self._tried.update(missing)
        threading.Thread(target=self._load, args=(missing,), name="ps-import", daemon=True).start()
        return True

    def _load(self, modules: tuple[str, ...]) -> None:
        """An import cannot be timed out, so a hung one is at least named: every ``warn_after``
        seconds, with what waits for it (the workers' own PS_REQUEST_TIMEOUT ends their wait)."""
        done = threading.Event()
        watch = threading.Thread(target=self._watch, args=(modules, done), name="ps-import-watch", daemon=True)
        watch.start()
        try:
            for name in modules:
                load(name)
        finally:
            done.set()
        self._call_soon(self._release)

    def _watch(self, modules: tuple[str, ...], done: threading.Event) -> None:
        start = time.monotonic()
        while not done.wait(self._warn_after):
            held = len(self._held or ())
            logger.warning("%s: importing %s for an optimizer has taken %.0fs; %d command(s) wait for it "
                           "(a hung import? py-spy dump --pid %d shows where)", self._name(), ", ".join(modules),
                           time.monotonic() - start, held, os.getpid())

    def _release(self) -> None:
        held, self._held = self._held or [], None
        for msg in held:
            self._handle(msg)


def load_for(updaters: Iterable[Any]) -> None:
    """A restart's recovered optimizers' slow imports, on its main thread before it serves
    (not at its first push, on the I/O thread)."""
    for updater in updaters:
        for name in updater.optimizer.modules:
            load(name)
