"""The scheduler role: forms the cluster, runs barriers, watches heartbeats, ends the job.

It answers every node over the connection the node opened (ROUTER identity), so a
node's own announced address only has to be right for the data path.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable

from . import netutil
from ._timing import DISCONNECT_GRACE, PauseWatch
from .config import Config
from .barriers import GROUPS, Barriers
from .ending import Ending
from .formation import Formation
from .membership import (Awaited, Member, Parked, Recovery, find_death, head_count, placement_warning,
                         restart_place, unrecoverable)
from .message import SCHEDULER, Command, Message, Role, node_name
from .rebuild import Rebuild
from .rejoin import KEY as REJOIN_KEY, Rejoin
from .van import Van, for_config, with_resend

logger = logging.getLogger(__name__)
TICK = 0.2      # s between two checks of silences, barriers and recoveries

# seconds a registered restart waits for the live nodes to acknowledge its dead self's death
# (a node that never does is dead itself, or stuck: heartbeats deal with it)
ACK_WAIT = 5.0



class Scheduler:
    """``port = s.start(); code = s.run()``; ``close()`` from any thread stops it."""

    def __init__(self, config: Config, van: Van | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.van = with_resend(van, config) if van is not None else for_config(config)
        self.van.on_peer_lost = self._on_peer_lost
        self.van.on_native_node = self._on_native_node
        self.clock = clock
        self.error: str | None = None
        self.exit_code: int | None = None
        self.port = 0
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._formation = Formation(config, self.van, clock, self._reply, self._on_pending_connection)
        self._nodes: dict[int, Member] = {}      # id -> node after formation
        self._ending = Ending(clock, config.num_workers, lambda i: self._nodes[i].rank, self._server_ids,
                              self._send_to, self._finish)
        self._closed_workers = self._ending.closed_workers
        self._barriers = Barriers(clock, config.stall_warning, self._members, self._closed_workers, self._describe,
                                  self._send_to)
        self._sync: bool | None = None
        self._ring: list[int] = []                  # server ranks, each keeping the replica of the one before
        self._formed_at: float | None = None
        self._down_since: dict[int, float] = {}    # node id -> when its connection dropped
        self._recovering: dict[int, Recovery] = {}  # node id -> its awaited restart
        self.restarts = 0                           # restarted nodes that registered
        self._deaths = itertools.count(1)           # numbers each declared death (Recovery.death)
        self._fenced_routes: set[bytes | None] = set()  # processes told they no longer belong to the job
        self._rebuild = Rebuild(clock, lambda: self._nodes, self._recovering, self._barriers, self._send_to,
                                self._node_up, self._deaths)    # a restarted scheduler's (ps/rejoin.py)

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> int:
        cfg = self.config
        # in Kubernetes the root URI is a Service's address, not this pod's: bind them all
        host = "0.0.0.0" if cfg.use_kubernetes else netutil.resolve(cfg.root_uri, within=cfg.connect_timeout)
        address = self.van.start(self._on_message, host, cfg.root_port or 0, name="scheduler")
        self.port = int(address.rsplit(":", 1)[1])
        self._formation.begin()
        logger.info("scheduler listening on %s, expecting %d servers and %d workers",
                    address, cfg.num_servers, cfg.num_workers)
        return self.port

    def run(self, timeout: float | None = None) -> int:
        """Serve until the job ends; 0 when every worker closed, 1 on any failure."""
        end = None if timeout is None else self.clock() + timeout
        pause = PauseWatch(TICK, lambda: "scheduler", clock=self.clock)
        while not self._done.wait(TICK):
            if not pause.hold():
                self._tick()
            if end is not None and self.clock() > end:
                self._finish(1, f"the scheduler's run(timeout={timeout}) expired")
        self.van.stop(linger=1.0)
        return self.exit_code if self.exit_code is not None else 1

    def close(self) -> None:
        """Stop now (Ctrl-C, or the launcher ending the job): not itself an error to report."""
        self._finish(1, "the scheduler was stopped", quiet=True)
        self.van.stop(linger=0.5)

    def _finish(self, code: int, error: str | None = None, quiet: bool = False) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.exit_code, self.error = code, error
            self._done.set()
        if quiet:
            logger.info("scheduler: %s", error)
        elif error and code:
            logger.error("scheduler: %s", error)
        else:
            logger.info("scheduler: job finished")

    # -- periodic checks -----------------------------------------------------------------
    def _tick(self) -> None:
        cfg, now = self.config, self.clock()
        with self._lock:
            if self._formed_at is None:
                self._formation.drop_dead()
                late = self._formation.late(now)
                if late is not None:
                    self._abort(late)
                return
            if self._ending.overdue(now):
                return
            self._barriers.warn_stalled(now)
            for node_id, rec in list(self._recovering.items()):
                if rec.parked is not None and now - rec.parked.since > ACK_WAIT:
                    self._admit_if_acked(node_id, force=True)
            for node_id in [i for i in self._down_since if self._gone(i)]:
                del self._down_since[node_id]
            death = find_death(now, self._nodes, self._recovering, self._down_since,
                               lambda i: not self._gone(i) and self._reachable(i), cfg.connect_timeout,
                               cfg.heartbeat_timeout if cfg.heartbeat_interval else 0, DISCONNECT_GRACE)
            if death is not None:
                self._node_failed(death.node_id, death.reason, final=death.final)

    # -- registered nodes before formation -------------------------------------------------
    def _on_pending_connection(self, watch_id: int, connected: bool) -> None:
        with self._lock:
            if self._formed_at is None:
                self._formation.connection(watch_id, connected)
                if connected:
                    self._maybe_form()      # it was the one formation waited for
                return
            node_id = self._formation.watch_after(watch_id, connected)
            if node_id is not None:
                self._on_connection(node_id, False)

    def _gone(self, node_id: int) -> bool:
        return self._ending.gone(node_id)

    def _on_connection(self, node_id: int, connected: bool) -> None:
        with self._lock:
            if connected:
                self._down_since.pop(node_id, None)
                self._formation.handed_over(node_id)
            elif not self._gone(node_id) and self._reachable(node_id):
                self._down_since.setdefault(node_id, self.clock())

    def _on_peer_lost(self, peer: object, msg: Message, waited: float) -> None:
        with self._lock:
            node_id = next((i for i, n in self._nodes.items() if n.route == peer), None)
            if node_id is None and msg.route is None:
                node_id = msg.recver
            if node_id in self._nodes and not self._gone(node_id) and self._reachable(node_id) \
                    and not self._done.is_set():
                self._node_failed(node_id, f"{self._describe(node_id)} did not acknowledge messages "
                                           f"for {waited:.1f}s (PS_RESEND); presumed dead")

    def _have(self) -> str:
        """Who the formed cluster has, for messages (before, the Formation says it)."""
        return head_count(list(self._nodes.values()), self.config.num_workers, self.config.num_servers)

    def _describe(self, node_id: int) -> str:
        return self._nodes[node_id].describe(node_id)

    # -- messages ------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        with self._lock:
            if self._done.is_set():
                return
            node = self._nodes.get(msg.sender)
            if msg.cmd != Command.ADD_NODE and msg.sender > SCHEDULER and self.config.max_restarts and \
                    (node is None or msg.sender in self._rebuild.unreported):
                # a live node of a job this scheduler's dead self ran: it is asked to report
                if self.config.resend:      # it numbers its report 1 (ps/van/reliable.py)
                    self.van.forget(msg.route)
                self._reply(msg.route, Command.REJOIN, request=True, recver=msg.sender)
                return
            if node is not None:
                if self._fenced(msg, node):
                    return
                node.last_seen = self.clock()
                node.route = msg.route
            handler = self._HANDLERS.get(msg.cmd)
            if handler is None:
                logger.warning("scheduler: unexpected %r", msg)
                return
            handler(self, msg)

    def _fenced(self, msg: Message, node: Member) -> bool:
        """A message from a process the job no longer counts as this node: one declared dead
        (its place kept for its restart), or another incarnation than the one admitted (each
        process has its own identity, its route). Not heard: its heartbeats would keep it from
        noticing, and its route would take its restart's messages. A live one is told to stop."""
        rec = self._recovering.get(msg.sender)
        declared = rec is not None and not rec.replaced
        if not declared and (msg.route is None or node.route is None or msg.route == node.route):
            return False
        if msg.route is not None and msg.route not in self._fenced_routes:
            self._fenced_routes.add(msg.route)
            why = f"it was declared dead ({rec.reason})" if declared else "its restart has taken its place"
            logger.warning("scheduler: a message from a process that was %s %s: not heard; it is told to stop",
                           self._describe(msg.sender), why)
            self._reply(msg.route, Command.ABORT, {
                "reason": f"this process was {self._describe(msg.sender)}, but {why}: it must stop"})
        return True

    def _reply(self, route: bytes | None, cmd: Command, body: Any = None, recver: int = 0,
               request: bool = False) -> None:
        self.van.send(Message(cmd, SCHEDULER, recver, body, request=request, route=route))

    def _send_to(self, node_id: int, cmd: Command, body: Any = None, request: bool = False) -> None:
        if self._rebuild.hold(node_id, cmd, body, request):    # sent once it reports (a restarted scheduler)
            return
        self.van.send(Message(cmd, SCHEDULER, node_id, body, request=request, route=self._nodes[node_id].route))

    def _on_add_node(self, msg: Message) -> None:
        try:
            info = Member.from_registration(msg.body, msg.route)
        except ValueError as exc:
            self._reply(msg.route, Command.ABORT, {"reason": f"bad registration: {exc}"})
            return
        info.registered_at = self.clock()
        role = info.role.name.lower()
        if isinstance(msg.body, dict) and REJOIN_KEY in msg.body:
            self._on_report(msg.body[REJOIN_KEY], info, msg.route)
            return
        if self._formed_at is not None and self.config.max_restarts:
            self._take_over(info, msg.route)
            return
        if self._formed_at is not None:
            self._reply(msg.route, Command.ABORT, {
                "reason": f"the cluster is already complete ({self._have()}); a {role} "
                          f"at {info.host}:{info.port} tried to join late"})
            return
        if self._formation.register(info):
            self._maybe_form()

    def _maybe_form(self) -> None:
        if self._formed_at is None and not self._done.is_set() and self._formation.complete():
            self._form()

    def _form(self) -> None:
        now = self.clock()
        formed = self._formation.form(now)
        if isinstance(formed, str):
            self._abort(formed)
            return
        self._nodes, self._sync, self._ring = formed.nodes, formed.sync, formed.ring
        warning = placement_warning(list(self._nodes.values()))
        if warning:
            logger.warning("scheduler: %s", warning)
        table = self._table()
        for node_id in self._nodes:
            self._send_to(node_id, Command.NODE_TABLE, {**table, "you": node_id})
        self._watch(self._nodes)
        self._formed_at = now
        logger.info("scheduler: cluster formed in %.2fs: %d servers, %d workers (%s)",
                    now - self._formation.started_at, self.config.num_servers, self.config.num_workers,
                    "dist_sync" if self._sync else "dist_async")

    def _watch(self, nodes: dict[int, Member]) -> None:
        """Its connection tells within milliseconds that a node died (ps/van/zmq_watch.py)."""
        for node_id, info in nodes.items():
            if info.addr.startswith(("tcp://", "ipc://")):
                self.van.watch(node_id, info.addr, self._on_connection)

    def _table(self) -> dict[str, Any]:
        """What every NODE_TABLE holds: the nodes, the kvstore type, the replica ring."""
        return {"nodes": [n.node(i).to_row() for i, n in sorted(self._nodes.items())], "sync": self._sync,
                "ring": self._ring}

    def _on_barrier(self, msg: Message) -> None:
        group = msg.body.get("group") if isinstance(msg.body, dict) else None
        if group not in GROUPS or msg.sender not in self._nodes:
            self._reply(msg.route, Command.BARRIER, {"group": group, "error": f"bad barrier request {msg.body!r}"})
            return
        self._barriers.arrive(msg.sender, group)

    def _members(self, group: str) -> list[int]:
        return [i for i, n in self._nodes.items() if n.role in GROUPS[group]]

    def _server_ids(self) -> list[int]:
        return self._members("servers")

    def _on_heartbeat(self, msg: Message) -> None:
        if msg.sender in self._nodes:
            self._reply(msg.route, Command.HEARTBEAT, recver=msg.sender)

    def _on_close(self, msg: Message) -> None:
        if msg.sender not in self._nodes or self._nodes[msg.sender].role != Role.WORKER:
            return
        self._ending.close_worker(msg.sender)
        self._barriers.check_all()
        self._ending.maybe_terminate()

    def _on_terminate(self, msg: Message) -> None:
        if not msg.request and msg.sender in self._nodes:
            self._ending.server_ended(msg.sender)

    # -- failures ------------------------------------------------------------------------
    def _node_failed(self, node_id: int, reason: str, final: bool = False) -> None:
        if self._ending.terminate_sent_at is not None and self._nodes[node_id].role == Role.SERVER:
            # every worker closed its store: the job's work is done and nobody needs this
            # server's state any more (killed while shutting down): no failure, no restart
            logger.warning("scheduler: %s, after every worker closed: nothing is lost; the job ends "
                           "without its acknowledgement", reason)
            self._recovering.pop(node_id, None)
            self._ending.server_ended(node_id)
            return
        if not final and self.config.max_restarts:
            why_not = unrecoverable(node_id, self._nodes, self._recovering, self.restarts, self.config.max_restarts,
                                    self.config.num_servers, self._ring)
            if why_not is None:
                self._node_down(node_id, reason)
                return
            reason = f"{reason}; {why_not}"
        body = {"node": node_name(node_id), "reason": reason}
        for other in self._nodes:
            rec = self._recovering.get(other)
            if (rec.replaced if rec is not None else other != node_id) and other not in self._closed_workers:
                self._send_to(other, Command.NODE_FAILED, body)
        self._finish(1, reason)

    # -- restarts (PS_MAX_RESTARTS) ---------------------------------------------------------
    def _node_down(self, node_id: int, reason: str) -> None:
        """A node died and may come back: everyone else waits for it instead of failing."""
        node = self._nodes[node_id]
        self._recovering[node_id] = Recovery(self.clock(), reason, death=next(self._deaths))
        self._barriers.died(node_id)
        self._down_since.pop(node_id, None)
        if node.route is not None:
            self.van.forget(node.route)
        logger.warning("scheduler: %s; waiting up to %gs for its restart (PS_MAX_RESTARTS=%d, %d used)",
                       reason, self.config.connect_timeout, self.config.max_restarts, self.restarts)
        rec = self._recovering[node_id]
        body = {"id": node_id, "reason": reason, "death": rec.death, "incarnation": node.incarnation}
        for other in self._nodes:
            if other != node_id and not self._gone(other) and self._reachable(other):
                self._send_to(other, Command.NODE_DOWN, body)
                rec.unacked.add(other)
        for other_id, other in list(self._recovering.items()):     # it cannot acknowledge any more
            if node_id in other.unacked:
                other.unacked.discard(node_id)
                self._admit_if_acked(other_id)
        if self._rebuild.dead(node_id):     # died with the old scheduler: its restart replays as the others
            self._barriers.estimate(node_id, [g for g, roles in GROUPS.items() if node.role in roles],
                                    self._rebuild.unreported)
        self._retry_early()

    def _on_node_down_ack(self, msg: Message) -> None:
        """A node acted on a NODE_DOWN (forgot the dead node's channels and rounds)."""
        node_id = msg.body.get("id") if isinstance(msg.body, dict) else None
        rec = self._recovering.get(node_id) if isinstance(node_id, int) else None
        if rec is not None and msg.body.get("death") == rec.death:     # not a late one for an earlier death
            rec.unacked.discard(msg.sender)
            self._admit_if_acked(node_id)

    def _admit_if_acked(self, node_id: int, force: bool = False) -> None:
        rec = self._recovering.get(node_id)
        if rec is None or rec.parked is None:
            return
        rec.unacked = {i for i in rec.unacked if not self._gone(i) and self._reachable(i)}
        if rec.unacked and not force:
            return
        if rec.unacked:
            logger.warning("scheduler: %s did not acknowledge the death of %s within %gs; its restart "
                           "joins anyway", ", ".join(self._describe(i) for i in sorted(rec.unacked)),
                           node_name(node_id), ACK_WAIT)
        parked, rec.parked = rec.parked, None
        self._admit(node_id, parked.info, parked.route)

    def closed_worker_ranks(self) -> set[int]:
        """The ranks of the workers that closed their store: their part of the job is over
        (thread-safe; the launcher does not start one again that then exits non-zero)."""
        with self._lock:
            return {self._nodes[i].rank for i in self._closed_workers}

    def awaiting_restart(self) -> list[Awaited]:
        """The nodes declared dead whose restart has not registered (thread-safe)."""
        with self._lock:
            now = self.clock()
            return [Awaited(self._nodes[i].role.name.lower(), self._nodes[i].rank, now - rec.since,
                            now - self._nodes[i].registered_at, rec.reason)
                    for i, rec in self._recovering.items() if not rec.replaced and rec.parked is None]

    def _reachable(self, node_id: int) -> bool:
        """Alive or restarted: a node awaiting its restart gets nothing (its restart learns
        who is down from its node table), a restart still recovering gets news of the others,
        and its own death is noticed like anyone's (killed while it recovers, it is awaited
        again; before, its next restart was refused and the job ended)."""
        rec = self._recovering.get(node_id)
        return rec is None or rec.replaced

    def _take_over(self, info: Member, route: bytes | None) -> None:
        """A node registering after formation is the restart of a dead node of its role."""
        role = info.role.name.lower()
        for node_id, since in list(self._down_since.items()):   # died moments ago, not yet declared
            if self._nodes[node_id].role == info.role and self._reachable(node_id):
                self._node_failed(node_id, f"{self._describe(node_id)} closed its connection and a new "
                                  f"{role} registered from {info.host}")
                if self._done.is_set():
                    self._reply(route, Command.ABORT, {"reason": self.error or "the job failed"})
                    return
        free = [i for i, r in self._recovering.items()
                if not r.replaced and r.parked is None and self._nodes[i].role == info.role]
        if not free and any(self._nodes[i].role == info.role for i in self._rebuild.unreported):
            self._rebuild.early.append((info, route))   # its dead self is not found dead yet
            return
        if not free:
            self._reply(route, Command.ABORT, {
                "reason": f"the cluster is already complete ({self._have()}) and no {role} is awaiting "
                          f"its restart; a {role} at {info.host}:{info.port} tried to join late"})
            return
        node_id = restart_place(info, free, self._nodes)
        self._recovering[node_id].parked = Parked(info, route, self.clock())
        self._admit_if_acked(node_id)

    def _admit(self, node_id: int, info: Member, route: bytes | None) -> None:
        """The restart takes the dead node's place: its id, rank and the current node table."""
        role = info.role.name.lower()
        old = self._nodes[node_id]
        info.rank, info.last_seen = old.rank, self.clock()
        self._nodes[node_id] = info
        self._recovering[node_id].replaced = True
        self.restarts += 1
        info.incarnation = self.restarts            # its NODE_TABLE's "restart", which it says it is
        self._barriers.replay(node_id)
        down = {str(i): r.reason for i, r in self._recovering.items() if i != node_id}
        self._reply(route, Command.ADD_NODE, {"have": self._have()})
        self._send_to(node_id, Command.NODE_TABLE, {**self._table(), "you": node_id, "restart": self.restarts,
                                                    "down": down})
        self._watch({node_id: info})
        logger.warning("scheduler: %s registered from %s as the restart of %s (restart %d of %d); "
                       "it recovers its state", role, info.addr, node_name(node_id), self.restarts,
                       self.config.max_restarts)

    def _on_rejoined(self, msg: Message) -> None:
        rec = self._recovering.get(msg.sender)
        if rec is None or not rec.replaced:
            return
        error = msg.body.get("error") if isinstance(msg.body, dict) else None
        if error:
            self._node_failed(msg.sender, f"{self._describe(msg.sender)} could not recover: {error}", final=True)
            return
        del self._recovering[msg.sender]
        logger.warning("scheduler: %s is back after %.1fs (restart %d of %d)", self._describe(msg.sender),
                       self.clock() - rec.since, self.restarts, self.config.max_restarts)
        if self._nodes[msg.sender].role == Role.SERVER:
            # its dead self knew which workers closed their stores: rounds missing their pushes fail
            for wid in sorted(self._closed_workers):
                self._send_to(msg.sender, Command.WORKER_CLOSED, {"rank": self._nodes[wid].rank, "id": wid})
        body = self._node_up(msg.sender)
        for other in self._nodes:
            if other != msg.sender and not self._gone(other) and self._reachable(other):
                self._send_to(other, Command.NODE_UP, body)

    def _node_up(self, node_id: int) -> dict[str, Any]:
        return {"row": self._nodes[node_id].node(node_id).to_row(), "restart": self.restarts}

    # -- a restarted scheduler: the job rebuilt from its live nodes (ps/rejoin.py, ps/rebuild.py)
    def _on_report(self, body: Any, info: Member, route: bytes | None) -> None:
        report = self._rebuild.accept(body, self.config.max_restarts, self.config.num_servers, self.config.num_workers)
        if isinstance(report, str):
            self._reply(route, Command.REJOIN, {"error": report})
            return
        if self._formed_at is None:
            self._begin_rebuild(report)
        node_id = report.node_id
        if node_id not in self._rebuild.unreported:     # reported already: a repeat, answered again
            if node_id in self._nodes and self._nodes[node_id].route == route:
                self._reply(route, Command.REJOIN, {"have": self._have()}, recver=node_id)
            return
        info.rank, info.last_seen, info.incarnation = self._nodes[node_id].rank, self.clock(), report.incarnation
        self._nodes[node_id] = info
        self.restarts = max(self.restarts, report.incarnation)
        self._reply(route, Command.REJOIN, {"have": self._have()}, recver=node_id)
        for cmd, held, request in self._rebuild.reported(node_id):
            self._send_to(node_id, cmd, held, request)
        self._rebuild.news(node_id, report)
        self._barriers.rejoin(node_id, report.passed, report.waiting)
        self._ending.report(node_id, report.closed_workers, report.closed, self._nodes)
        self._retry_early()
        self._barriers.check_all()
        if not self._rebuild.unreported:
            logger.warning("scheduler: every node of the job reported in %.2fs; it goes on",
                           self.clock() - self._formed_at)

    def _begin_rebuild(self, report: Rejoin) -> None:
        """The first report: the job as that node knows it. Registrations so far are restarts
        of nodes found dead later; every node is watched, as at formation."""
        self._formed_at = self.clock()
        self._nodes = self._rebuild.begin(report, self._formed_at, self._formation.pending)
        self._formation.forget_pending()
        self._sync, self._ring = report.sync, report.ring
        self._watch(self._nodes)
        logger.warning("scheduler: a restarted scheduler: rebuilding the job (%d servers, %d workers, %s) from "
                       "the reports of its live nodes", self.config.num_servers, self.config.num_workers,
                       "dist_sync" if self._sync else "dist_async")

    def _retry_early(self) -> None:
        """Restarts that registered before their dead self was found dead take its place now."""
        early, self._rebuild.early = self._rebuild.early, []
        for member, route in early:
            self._take_over(member, route)

    def _on_native_node(self, exc: Exception) -> None:
        """A native MXNet node would wait for this job forever, and the job for it: end it."""
        with self._lock:
            if not self._done.is_set():
                self._abort(str(exc))

    def _abort(self, reason: str) -> None:
        for info in [*self._formation.pending, *self._nodes.values()]:
            self._reply(info.route, Command.ABORT, {"reason": reason})
        self._finish(1, reason)

    _HANDLERS = {
        Command.ADD_NODE: _on_add_node,
        Command.BARRIER: _on_barrier,
        Command.HEARTBEAT: _on_heartbeat,
        Command.CLOSE: _on_close,
        Command.TERMINATE: _on_terminate,
        Command.REJOINED: _on_rejoined,
        Command.NODE_DOWN: _on_node_down_ack,
    }
