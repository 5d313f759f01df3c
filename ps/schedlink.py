"""A server's or worker's link to the scheduler: heartbeats, whether the scheduler is
still there, and, under PS_MAX_RESTARTS, reporting to its restart.

A node learns that the scheduler is gone in two ways: its connection closed for
DISCONNECT_GRACE (a dead process, or the launcher's: the kernel closes its connections),
or silence for PS_HEARTBEAT_TIMEOUT (a hung scheduler, or a host that vanished without
closing anything). Without restarts that ends the job. With them the node goes on
(pushes and pulls do not pass through the scheduler) and waits up to PS_CONNECT_TIMEOUT
for a scheduler at the same address; the restart does not know the node and answers its
first heartbeat with REJOIN, and the node sends its report (ps/rejoin.py).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ._timing import DISCONNECT_GRACE, PauseWatch
from .config import Config
from .errors import PeerLostError, PSError
from .message import SCHEDULER, Command, Message
from .van import Van

logger = logging.getLogger("ps.postoffice")     # the node's own lines, where operators look for them


class SchedulerLink:
    def __init__(self, config: Config, van: Van, clock: Callable[[], float], name: Callable[[], str],
                 report: Callable[[], dict[str, Any]], fail: Callable[[PSError], None], over: Callable[[], bool],
                 beat: Callable[[], dict[str, Any]] = dict):
        """``name()`` names the node in log lines; ``report()`` is its registration with its
        rejoin report; ``fail(exc)`` ends it; ``over()``: its part of the job is over (the
        scheduler may then go first); ``beat()`` what each heartbeat carries (ps/nodestats.py)."""
        self.config = config
        self.van = van
        self.clock = clock
        self._name = name
        self._report = report
        self._fail = fail
        self._over = over
        self._beat = beat
        self.address = ""
        self.last_contact = clock()
        self.down_since: float | None = None    # its connection closed (van.watch)
        self.returns = 0                        # times its connection came back after closing
        self._seen_up = False
        self.lost: float | None = None          # since when it is gone, while its restart may come
        self._reported_at: float | None = None  # the last report sent to a restart, unanswered
        self._node_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def away(self) -> bool:
        """Gone or disconnected now (a CLOSE waits for its restart rather than giving up)."""
        return self.lost is not None or self.down_since is not None

    def watch(self, address: str) -> None:
        """Watch the scheduler's connection from registration on: a scheduler restarted
        before the cluster formed must be registered with again."""
        self.address = address
        if address.startswith(("tcp://", "ipc://")):
            self.van.watch(SCHEDULER, address, self._on_connection)

    def start(self, node_id: int) -> None:
        self._node_id = node_id
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"ps-heartbeat[{self._name()}]")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _on_connection(self, _node_id: int, connected: bool) -> None:
        if connected and self.down_since is not None and self._seen_up:
            self.returns += 1        # the same scheduler after a blip, or its restart
        self._seen_up = self._seen_up or connected
        self.down_since = None if connected else (self.down_since or self.clock())

    def heard(self, msg: Message) -> None:
        """A message from the scheduler (I/O thread)."""
        silent_since, self.last_contact = self.last_contact, self.clock()
        if msg.cmd == Command.HEARTBEAT and self.lost is not None:
            # it knows this node: the same scheduler after a blip, or its restart took the
            # report (and its answer was lost)
            self.lost, self._reported_at = None, None
            logger.warning("%s: the scheduler answers again", self._name())
        if msg.cmd != Command.REJOIN:
            return
        if msg.request:                 # a scheduler that does not know this node: its restart
            self._send_report(silent_since)
            return
        error = msg.body.get("error") if isinstance(msg.body, dict) else None
        if error:
            self._fail(PSError(f"the restarted scheduler refused this node: {error}"))
            return
        lost, self.lost, self._reported_at, self.down_since = self.lost, None, None, None
        if lost is not None:
            logger.warning("%s: rejoined the restarted scheduler, %.1fs after it last answered",
                           self._name(), self.clock() - lost)

    def _send_report(self, silent_since: float) -> None:
        """Once per restart: it asks at every message of ours until the report reaches it
        (again only if it asks long after: a report lost with a scheduler that died again)."""
        now = self.clock()
        if self._reported_at is not None and now - self._reported_at < max(4 * self.config.heartbeat_interval, 2.0):
            return
        if self.lost is None:
            self.lost = silent_since
            logger.warning("%s: the scheduler was restarted; reporting to it", self._name())
        self._reported_at = now
        if self.config.resend:
            self.van.forget(SCHEDULER)      # the new process numbers our messages from 1
        self.van.send(Message(Command.ADD_NODE, self._node_id, SCHEDULER, self._report()))

    def _loop(self) -> None:
        interval, timeout = self.config.heartbeat_interval, self.config.heartbeat_timeout
        step = min(interval, 0.5) if interval else 0.5
        next_beat = self.clock() + interval
        pause = PauseWatch(step, self._name, clock=self.clock)
        while not self._stop.wait(step):
            held = pause.hold()
            if interval and self.clock() >= next_beat:
                next_beat = self.clock() + interval
                try:
                    self.van.send(Message(Command.HEARTBEAT, self._node_id, SCHEDULER, self._beat()))
                except PSError:
                    return
            silent = self.clock() - self.last_contact
            why = None
            if interval and timeout and silent > timeout and not held:
                why = (f"the scheduler has not answered for {silent:.1f}s "
                       f"(PS_HEARTBEAT_TIMEOUT={timeout:g}); it is presumed dead")
            down = self.down_since
            if down is not None and self.clock() - down > DISCONNECT_GRACE and not (held or self._over()):
                why = (f"the connection to the scheduler at {self.address} closed and did not come back "
                       f"within {DISCONNECT_GRACE:g}s: the scheduler died (or the launcher that runs it)")
            if why is not None and not self._gone(why):
                return

    def _gone(self, why: str) -> bool:
        """Without restarts the job ends here (False); with them the node goes on and waits
        for the restart, up to PS_CONNECT_TIMEOUT (True while it may still come)."""
        limit = self.config.connect_timeout
        if not self.config.max_restarts:
            self._fail(PeerLostError(why, "H"))
            return False
        if self.lost is None:
            self.lost = self.clock()
            logger.warning("%s: %s; going on, and waiting up to %gs (PS_CONNECT_TIMEOUT) for its restart "
                           "(PS_MAX_RESTARTS)", self._name(), why, limit)
        elif self.clock() - self.lost > limit:
            self._fail(PeerLostError(f"{why}, and no scheduler came back at {self.address} within "
                                     f"{limit:g}s (PS_CONNECT_TIMEOUT)", "H"))
            return False
        return True
