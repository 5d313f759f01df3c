"""The scheduler's side of PS_DEADLOCK_CHECK: hold the blocked workers' reports, decide by
the wait-for rule (ps/waits.py), and carry a verdict out.

A verdict is carried out in two steps so that no worker pushes into a round the
disagreement left half full: every server first drops its open rounds and answers with the
rounds each key closed so far; only then is every worker told (MismatchError, and where
to number its next pushes), and the barrier of every worker forgotten (its waiters raise
the verdict). A server that does not answer within ``ACK_WAIT`` seconds (dying: its
failure is the scheduler's to report) does not hold the verdict back.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, NamedTuple

from .message import Command
from .waits import Report, explain, stuck

logger = logging.getLogger("ps.scheduler")
ACK_WAIT = 10.0     # s a verdict waits for the servers to drop their open rounds

Send = Callable[..., None]


class _Held(NamedTuple):
    """A worker's last two reports of its current blocked spell, and when the last came."""
    previous: Report | None
    latest: Report
    at: float


class _Verdict(NamedTuple):
    number: int
    text: str | None            # None: a realignment every worker asked for
    servers: set[int]           # that have not answered yet
    closed: dict[int, int]      # key -> its rounds closed, as the servers answered
    since: float
    nodes: list[int] | None     # who hears it (None: every live worker)


class WaitJudge:
    """Under the scheduler's lock. ``workers()``: node ids of the live workers (not closed;
    empty while a node is awaited after a death: no verdict then); ``servers()``: node ids
    of the servers; ``send(node, cmd, body, request=...)``; ``forget_barrier(group)``."""

    def __init__(self, clock: Callable[[], float], period: float, workers: Callable[[], list[int]],
                 servers: Callable[[], list[int]], send: Send, forget_barrier: Callable[[str], None]):
        self.clock, self.period = clock, period
        self._workers, self._servers, self._send, self._forget_barrier = workers, servers, send, forget_barrier
        self._held: dict[int, _Held] = {}
        self._verdict: _Verdict | None = None
        # workers that raised a check's MismatchError and wait for the rest: node -> (rank, the
        # ranks of its process set, None for every worker)
        self._resets: dict[int, tuple[int, frozenset[int] | None]] = {}
        self._numbers = itertools.count(1)
        self.verdicts = 0                   # carried out (for tests and the logs)

    def report(self, node_id: int, body: Any) -> None:
        if not isinstance(body, dict) or self._verdict is not None:
            return
        if "reset" in body:
            members = body.get("members")
            self._resets[node_id] = (int(body.get("rank", -1)), None if members is None else frozenset(members))
            self._realign(self._resets[node_id][1])
            return
        if body.get("over"):
            held = self._held.get(node_id)
            if held is not None and held.latest.episode == body.get("episode"):
                del self._held[node_id]
            return
        try:
            report = Report.from_body(body)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("scheduler: a bad deadlock report from node %d: %s", node_id, exc)
            return
        held = self._held.get(node_id)
        previous = held.latest if held is not None and held.latest.episode == report.episode else None
        self._held[node_id] = _Held(previous, report, self.clock())
        self._judge()

    def _judge(self) -> None:
        live = self._workers()
        now = self.clock()
        reports = {}
        for node_id in live:
            held = self._held.get(node_id)
            # every live worker blocked, each having pushed nothing over its last two reports
            if held is None or held.previous is None or held.previous.version != held.latest.version or \
                    now - held.at > 3 * self.period:
                return
            reports[held.latest.rank] = held.latest
        if not reports or stuck(reports) != set(reports):
            return
        text = explain(reports)
        logger.warning("scheduler: %s", text)
        self._start(text, now)

    def _realign(self, members: frozenset[int] | None) -> None:
        """Every worker (of a process set: ``members``, ranks) raised a check's MismatchError
        and waits: drop the open rounds (of the set's keys), then let them go."""
        live = self._workers()
        ranks = {node: rank for node, (rank, group) in self._resets.items() if group == members}
        needed = set(ranks.values()) >= members if members is not None else set(ranks) >= set(live)
        if live and needed:
            nodes = [node for node in ranks if members is None or ranks[node] in members]
            self._start(None, self.clock(), members, nodes)

    def _start(self, text: str | None, now: float, members: frozenset[int] | None = None,
               nodes: list[int] | None = None) -> None:
        """Have the servers drop their open rounds (of the keys only ``members`` push, if
        given); ``nodes`` (default: every live worker) hear ``text`` (None: a realignment they
        asked for) once they did."""
        servers = set(self._servers())
        self._verdict = _Verdict(next(self._numbers), text, servers, {}, now, nodes)
        body = {"verdict": self._verdict.number, "members": None if members is None else sorted(members)}
        for server in servers:
            self._send(server, Command.DROP_ROUNDS, body, request=True)
        if not servers:
            self._carry_out()

    def dropped(self, node_id: int, body: Any) -> None:
        """A server's answer to DROP_ROUNDS."""
        verdict = self._verdict
        if verdict is None or not isinstance(body, dict) or body.get("verdict") != verdict.number:
            return
        for key, closed in body.get("closed", []):
            key, closed = int(key), int(closed)
            verdict.closed[key] = min(closed, verdict.closed.get(key, closed))
        verdict.servers.discard(node_id)
        if not verdict.servers:
            self._carry_out()

    def tick(self, now: float) -> None:
        verdict = self._verdict
        if verdict is not None and now - verdict.since > ACK_WAIT:
            logger.warning("scheduler: servers %s did not drop their open rounds within %gs; the workers are told "
                           "of the deadlock anyway", sorted(verdict.servers), ACK_WAIT)
            self._carry_out()

    def _carry_out(self) -> None:
        verdict, self._verdict = self._verdict, None
        body = {"verdict": verdict.text, "closed": [[k, n] for k, n in verdict.closed.items()]}
        told = self._workers() if verdict.nodes is None else verdict.nodes
        for node_id in told:
            self._resets.pop(node_id, None)
            self._held.pop(node_id, None)
        if verdict.nodes is None:
            self._held.clear()
            self._resets.clear()
            self._forget_barrier("workers")
        for node_id in told:
            self._send(node_id, Command.BLOCKED, body)
        self.verdicts += verdict.text is not None
