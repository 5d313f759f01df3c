"""The scheduler role: forms the cluster, runs barriers, watches heartbeats, ends the job.

It answers every node over the connection the node opened (ROUTER identity), so a
node's own announced address only has to be right for the data path.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from . import netutil
from ._timing import DISCONNECT_GRACE, PauseWatch
from .config import Config
from .errors import ConfigError
from .barriers import GROUPS, Barriers
from .ending import Ending
from .formation import Formation
from .jobview import BarrierStall, JobFacts, JobView, NodeFacts
from .membership import (Awaited, Member, Terms, find_death, head_count, node_state, placement_warning,
                         unrecoverable)
from .message import SCHEDULER, Command, Message, Role, node_name
from .readmission import ACK_WAIT, Readmission
from .rebuild import Rebuild
from .rejoin import KEY as REJOIN_KEY, Rejoin
from .van import Van, for_config, with_resend
from .waitjudge import WaitJudge

logger = logging.getLogger(__name__)
TICK = 0.2      # s between two checks of silences, barriers and recoveries



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
        self._formation = Formation(config, self.van, clock, self.reply, self._on_pending_connection)
        self.nodes: dict[int, Member] = {}      # id -> node after formation
        self._ending = Ending(clock, config.num_workers, lambda i: self.nodes[i].rank, self._server_ids,
                              self.send_to, self._finish)
        self.closed_workers = self._ending.closed_workers
        self.barriers = Barriers(clock, config.stall_warning, self._members, self.closed_workers, self.describe,
                                  self.send_to)
        self.terms = Terms(True)                 # the workers' kvstore type and chunk, once formed
        self._ring: list[int] = []                  # server ranks, each keeping the replica of the one before
        self._formed_at: float | None = None
        self.down_since: dict[int, float] = {}    # node id -> when its connection dropped
        self.readmission = Readmission(self)        # dead nodes awaited, their restarts admitted
        self._fenced_routes: set[bytes | None] = set()  # processes told they no longer belong to the job
        self.waits = WaitJudge(clock, config.deadlock_check, self._blocked_candidates, self._server_ids,
                               self.send_to, self.barriers.forget)     # PS_DEADLOCK_CHECK (ps/waits.py)
        self.view = JobView(clock)                  # the dashboard's picture of the job (PS_DASHBOARD)
        self.dashboard: Any = None                  # its HTTP server (ps/dashboard), if PS_DASHBOARD
        self.failed: dict[int, str] = {}            # node id -> why its death ended the job
        self.rebuild = Rebuild(clock, lambda: self.nodes, self.readmission.recovering, self.barriers, self.send_to,
                               self.readmission.node_up, self.readmission.deaths)    # a restarted scheduler's

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
        if cfg.dashboard is not None:
            try:
                from .dashboard import Dashboard    # prometheus_client only where it is asked for
            except ImportError as exc:
                self.van.stop(linger=0)
                raise ConfigError(f"PS_DASHBOARD (--dashboard) needs the package {exc.name}: "
                                  "pip install 'ps[dashboard]'") from None
            try:
                self.dashboard = Dashboard(cfg, self.view, self.facts)
            except BaseException:
                self.van.stop(linger=0)
                raise
            logger.info("scheduler: dashboard at %s", self.dashboard.url)
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
        if self.dashboard is not None:
            linger = self.config.dashboard_linger
            if linger:
                logger.info("scheduler: the job ended; its dashboard stays up for %gs (PS_DASHBOARD_LINGER)", linger)
                time.sleep(linger)
            self.dashboard.close()

    def _finish(self, code: int, error: str | None = None, quiet: bool = False) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.exit_code, self.error = code, error
            self._done.set()
            if self.dashboard is not None:
                self.view.observe(self._facts())
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
                late = self._formation.tick(now)
                if late is not None:
                    self._abort(late)
                return
            if self._ending.overdue(now):
                return
            self.barriers.warn_stalled(now)
            self.waits.tick(now)
            for node_id, rec in list(self.readmission.recovering.items()):
                if rec.parked is not None and now - rec.parked.since > ACK_WAIT:
                    self.readmission.admit_if_acked(node_id, force=True)
            for node_id in [i for i in self.down_since if self.gone(i)]:
                del self.down_since[node_id]
            death = find_death(now, self.nodes, self.readmission.recovering, self.down_since,
                               lambda i: not self.gone(i) and self.readmission.reachable(i), cfg.connect_timeout,
                               cfg.heartbeat_timeout if cfg.heartbeat_interval else 0, DISCONNECT_GRACE)
            if death is not None:
                self.node_failed(death.node_id, death.reason, final=death.final)
            if self.dashboard is not None:
                self.view.observe(self._facts())

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

    def gone(self, node_id: int) -> bool:
        return self._ending.gone(node_id)

    def _on_connection(self, node_id: int, connected: bool) -> None:
        with self._lock:
            if connected:
                self.down_since.pop(node_id, None)
                self._formation.handed_over(node_id)
            elif not self.gone(node_id) and self.readmission.reachable(node_id):
                self.down_since.setdefault(node_id, self.clock())

    def _on_peer_lost(self, peer: object, msg: Message, waited: float) -> None:
        with self._lock:
            node_id = next((i for i, n in self.nodes.items() if n.route == peer), None)
            if node_id is None and msg.route is None:
                node_id = msg.recver
            if node_id in self.nodes and not self.gone(node_id) and self.readmission.reachable(node_id) \
                    and not self._done.is_set():
                self.node_failed(node_id, f"{self.describe(node_id)} did not acknowledge messages "
                                           f"for {waited:.1f}s (PS_RESEND); presumed dead")

    def have(self) -> str:
        """Who the formed cluster has, for messages (before, the Formation says it)."""
        return head_count(list(self.nodes.values()), self.config.num_workers, self.config.num_servers)

    def describe(self, node_id: int) -> str:
        return self.nodes[node_id].describe(node_id)

    # -- messages ------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        with self._lock:
            if self._done.is_set():
                return
            node = self.nodes.get(msg.sender)
            if msg.cmd != Command.ADD_NODE and msg.sender > SCHEDULER and self.config.max_restarts and \
                    (node is None or msg.sender in self.rebuild.unreported):
                # a live node of a job this scheduler's dead self ran: it is asked to report
                if self.config.resend:      # it numbers its report 1 (ps/van/reliable.py)
                    self.van.forget(msg.route)
                self.reply(msg.route, Command.REJOIN, request=True, recver=msg.sender)
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
        rec = self.readmission.recovering.get(msg.sender)
        declared = rec is not None and not rec.replaced
        if not declared and (msg.route is None or node.route is None or msg.route == node.route):
            return False
        if msg.route is not None and msg.route not in self._fenced_routes:
            self._fenced_routes.add(msg.route)
            why = f"it was declared dead ({rec.reason})" if declared else "its restart has taken its place"
            logger.warning("scheduler: a message from a process that was %s %s: not heard; it is told to stop",
                           self.describe(msg.sender), why)
            self.reply(msg.route, Command.ABORT, {
                "reason": f"this process was {self.describe(msg.sender)}, but {why}: it must stop"})
        return True

    def reply(self, route: bytes | None, cmd: Command, body: Any = None, recver: int = 0,
               request: bool = False) -> None:
        self.van.send(Message(cmd, SCHEDULER, recver, body, request=request, route=route))

    def send_to(self, node_id: int, cmd: Command, body: Any = None, request: bool = False) -> None:
        if self.rebuild.hold(node_id, cmd, body, request):    # sent once it reports (a restarted scheduler)
            return
        self.van.send(Message(cmd, SCHEDULER, node_id, body, request=request, route=self.nodes[node_id].route))

    def _on_add_node(self, msg: Message) -> None:
        try:
            info = Member.from_registration(msg.body, msg.route)
        except ValueError as exc:
            self.reply(msg.route, Command.ABORT, {"reason": f"bad registration: {exc}"})
            return
        info.registered_at = self.clock()
        role = info.role.name.lower()
        if isinstance(msg.body, dict) and REJOIN_KEY in msg.body:
            self._on_report(msg.body[REJOIN_KEY], info, msg.route)
            return
        if self._formed_at is not None and self.config.max_restarts:
            self.readmission.take_over(info, msg.route)
            return
        if self._formed_at is not None:
            self.reply(msg.route, Command.ABORT, {
                "reason": f"the cluster is already complete ({self.have()}); a {role} "
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
        self.nodes, self.terms, self._ring = formed.nodes, formed.terms, formed.ring
        warning = placement_warning(list(self.nodes.values()))
        if warning:
            logger.warning("scheduler: %s", warning)
        table = self.table()
        for node_id in self.nodes:
            self.send_to(node_id, Command.NODE_TABLE, {**table, "you": node_id})
        self.watch(self.nodes)
        self._formed_at = now
        logger.info("scheduler: cluster formed in %.2fs: %d servers, %d workers (%s)",
                    now - self._formation.started_at, self.config.num_servers, self.config.num_workers,
                    self.terms.kind)

    def watch(self, nodes: dict[int, Member]) -> None:
        """Its connection tells within milliseconds that a node died (ps/van/zmq_watch.py)."""
        for node_id, info in nodes.items():
            if info.addr.startswith(("tcp://", "ipc://")):
                self.van.watch(node_id, info.addr, self._on_connection)

    def table(self) -> dict[str, Any]:
        """What every NODE_TABLE holds: the nodes, the workers' terms, the replica ring (a node
        reports the terms back to a restarted scheduler, which has no other way to learn them)."""
        return {"nodes": [n.node(i).to_row() for i, n in sorted(self.nodes.items())], "sync": self.terms.sync,
                "chunk": self.terms.chunk, "ring": self._ring}

    def _on_barrier(self, msg: Message) -> None:
        group = msg.body.get("group") if isinstance(msg.body, dict) else None
        if group not in GROUPS or msg.sender not in self.nodes:
            self.reply(msg.route, Command.BARRIER, {"group": group, "error": f"bad barrier request {msg.body!r}"})
            return
        self.barriers.arrive(msg.sender, group)

    def _members(self, group: str) -> list[int]:
        return [i for i, n in self.nodes.items() if n.role in GROUPS[group]]

    def _server_ids(self) -> list[int]:
        return self._members("servers")

    def _blocked_candidates(self) -> list[int]:
        """The workers a deadlock verdict needs a report from: every live one; none while a
        dead node is awaited (its restart may yet push what the others wait for)."""
        if self.readmission.recovering:
            return []
        return [i for i in self._members("workers") if i not in self.closed_workers]

    def _on_heartbeat(self, msg: Message) -> None:
        if msg.sender in self.nodes:
            self.reply(msg.route, Command.HEARTBEAT, recver=msg.sender)
            if self.dashboard is not None and msg.body is not None:
                self.view.report(msg.sender, msg.body)

    def _on_close(self, msg: Message) -> None:
        if msg.sender not in self.nodes or self.nodes[msg.sender].role != Role.WORKER:
            return
        self._ending.close_worker(msg.sender)
        self.barriers.check_all()
        self._ending.maybe_terminate()

    def _on_terminate(self, msg: Message) -> None:
        if not msg.request and msg.sender in self.nodes:
            self._ending.server_ended(msg.sender)

    # -- failures ------------------------------------------------------------------------
    def node_failed(self, node_id: int, reason: str, final: bool = False) -> None:
        if self._ending.terminate_sent_at is not None and self.nodes[node_id].role == Role.SERVER:
            # every worker closed its store: the job's work is done and nobody needs this
            # server's state any more (killed while shutting down): no failure, no restart
            logger.warning("scheduler: %s, after every worker closed: nothing is lost; the job ends "
                           "without its acknowledgement", reason)
            self.readmission.recovering.pop(node_id, None)
            self._ending.server_ended(node_id)
            return
        if not final and self.config.max_restarts:
            readmission = self.readmission
            why_not = unrecoverable(node_id, self.nodes, readmission.recovering, readmission.process_restarts,
                                    self.config.max_restarts, self.config.num_servers, self._ring)
            if why_not is None:
                self.readmission.node_down(node_id, reason)
                return
            reason = f"{reason}; {why_not}"
        body = {"node": node_name(node_id), "reason": reason}
        self.failed[node_id] = reason
        for other in self.nodes:
            rec = self.readmission.recovering.get(other)
            if (rec.replaced if rec is not None else other != node_id) and other not in self.closed_workers:
                self.send_to(other, Command.NODE_FAILED, body)
        self._finish(1, reason)

    def process_failed(self, role: str, rank: int, why: str) -> None:
        """The launcher saw a node's process end the job before this scheduler did (its exit
        status came first): the job ends for that reason, the node counted dead."""
        with self._lock:
            node_id = next((i for i, n in self.nodes.items() if n.role.name.lower() == role and n.rank == rank), None)
            if node_id is not None and not self._done.is_set():
                self.failed[node_id] = why
            self._finish(1, why, quiet=True)

    # -- what the launcher reads (launcher/supervise.py's SchedulerView) ----------------------
    @property
    def formed(self) -> bool:
        """Every node registered and was sent its table."""
        return self._formed_at is not None

    def closed_worker_ranks(self) -> set[int]:
        """The ranks of the workers that closed their store: their part of the job is over
        (thread-safe; the launcher does not start one again that then exits non-zero)."""
        with self._lock:
            return {self.nodes[i].rank for i in self.closed_workers}

    def awaiting_restart(self) -> list[Awaited]:
        """The nodes declared dead whose restart has not registered (thread-safe)."""
        with self._lock:
            now = self.clock()
            return [Awaited(self.nodes[i].role.name.lower(), self.nodes[i].rank, now - rec.since,
                            now - self.nodes[i].registered_at, rec.reason)
                    for i, rec in self.readmission.recovering.items() if not rec.replaced and rec.parked is None]

    def facts(self) -> JobFacts:
        """The job as the dashboard shows it (thread-safe)."""
        with self._lock:
            return self._facts()

    def _facts(self) -> JobFacts:
        now, wall = self.clock(), time.time()
        formed = self._formed_at is not None
        nodes = []
        for node_id, node in sorted(self.nodes.items()):
            state, reason = node_state(node_id, self.failed, self.readmission.recovering, self.closed_workers,
                                       self._done.is_set())
            nodes.append(NodeFacts(node_id, node_name(node_id), node.role.name.lower(), node.rank, node.host,
                                   node.hostname, node.pid, wall - (now - node.registered_at), node.incarnation,
                                   state, reason))
        stalls = tuple(BarrierStall(group, tuple(map(self.describe, missing)), tuple(map(self.describe, arrived)),
                                    seconds) for group, missing, arrived, seconds in self.barriers.stalled(now))
        cfg = self.config
        return JobFacts("ended" if self._done.is_set() else "running" if formed else "forming",
                        self.terms.kind if formed else None, cfg.num_workers,
                        cfg.num_servers, self.readmission.restarts, cfg.heartbeat_interval, tuple(nodes), stalls,
                        (self.exit_code, self.error or "") if self.exit_code is not None else None)

    @property
    def restarts(self) -> int:
        """Restarted nodes that registered."""
        return self.readmission.restarts

    @property
    def ended(self) -> bool:
        return self._done.is_set()

    # -- a restarted scheduler: the job rebuilt from its live nodes (ps/rejoin.py, ps/rebuild.py)
    def _on_report(self, body: Any, info: Member, route: bytes | None) -> None:
        report = self.rebuild.accept(body, self.config.max_restarts, self.config.num_servers, self.config.num_workers)
        if isinstance(report, str):
            self.reply(route, Command.REJOIN, {"error": report})
            return
        if self._formed_at is None:
            self._begin_rebuild(report)
        node_id = report.node_id
        if node_id not in self.rebuild.unreported:     # reported already: a repeat, answered again
            if node_id in self.nodes and self.nodes[node_id].route == route:
                self.reply(route, Command.REJOIN, {"have": self.have()}, recver=node_id)
            return
        info.rank, info.last_seen, info.incarnation = self.nodes[node_id].rank, self.clock(), report.incarnation
        self.nodes[node_id] = info
        self.readmission.restarts = max(self.readmission.restarts, report.incarnation)
        # counted by node before this scheduler: at most that many processes
        self.readmission.process_restarts = max(self.readmission.process_restarts, report.incarnation)
        self.reply(route, Command.REJOIN, {"have": self.have()}, recver=node_id)
        for cmd, held, request in self.rebuild.reported(node_id):
            self.send_to(node_id, cmd, held, request)
        self.rebuild.news(node_id, report)
        self.barriers.rejoin(node_id, report.passed, report.waiting)
        self._ending.report(node_id, report.closed_workers, report.closed, self.nodes)
        self.readmission.retry_early()
        self.barriers.check_all()
        if not self.rebuild.unreported:
            logger.warning("scheduler: every node of the job reported in %.2fs; it goes on",
                           self.clock() - self._formed_at)

    def _begin_rebuild(self, report: Rejoin) -> None:
        """The first report: the job as that node knows it. Registrations so far are restarts
        of nodes found dead later; every node is watched, as at formation."""
        self._formed_at = self.clock()
        self.nodes = self.rebuild.begin(report, self._formed_at, self._formation.pending)
        self._formation.forget_pending()
        self.terms, self._ring = Terms(report.sync, report.chunk), report.ring
        self.watch(self.nodes)
        logger.warning("scheduler: a restarted scheduler: rebuilding the job (%d servers, %d workers, %s) from "
                       "the reports of its live nodes", self.config.num_servers, self.config.num_workers,
                       self.terms.kind)

    def _on_native_node(self, exc: Exception) -> None:
        """A native MXNet node would wait for this job forever, and the job for it: end it."""
        with self._lock:
            if not self._done.is_set():
                self._abort(str(exc))

    def _abort(self, reason: str) -> None:
        for info in [*self._formation.pending, *self.nodes.values()]:
            self.reply(info.route, Command.ABORT, {"reason": reason})
        self._finish(1, reason)

    _HANDLERS = {
        Command.ADD_NODE: _on_add_node,
        Command.BARRIER: _on_barrier,
        Command.HEARTBEAT: _on_heartbeat,
        Command.CLOSE: _on_close,
        Command.TERMINATE: _on_terminate,
        Command.REJOINED: lambda self, msg: self.readmission.on_rejoined(msg),
        Command.NODE_DOWN: lambda self, msg: self.readmission.on_node_down_ack(msg),
        Command.BLOCKED: lambda self, msg: self.waits.report(msg.sender, msg.body),
        Command.DROP_ROUNDS: lambda self, msg: self.waits.dropped(msg.sender, msg.body),
    }
