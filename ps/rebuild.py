"""A restarted scheduler rebuilding the job from its live nodes' reports (ps/rejoin.py).

The first report gives the job: its nodes, ranks, kvstore type and replica ring. Every
node of it is then expected to report; what the scheduler would send one that has not is
held for it (its report is what it knew until then, so the news goes after). A node that
does not report is found dead as any node is (its connection refused, its heartbeats
missing) and its restart takes its place. The reports also bring who was down awaiting a
restart: a node that one report names down and another misses is told, and a node named
down that reports alive is announced back up to those that named it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from .barriers import Barriers
from .membership import Member, Recovery
from .message import Command, Role
from .rejoin import Rejoin

Send = Callable[[int, Command, Any], None]


class Rebuild:
    """The scheduler's record of a rebuild (under the scheduler's lock)."""

    def __init__(self, clock: Callable[[], float], nodes: Callable[[], dict[int, Member]],
                 recovering: dict[int, Recovery], barriers: Barriers, send: Send,
                 node_up: Callable[[int], dict[str, Any]], deaths: Iterator[int]):
        """``nodes()``: the scheduler's node table; ``recovering``: its dead nodes awaiting a
        restart (changed here); ``send(id, cmd, body)`` tells a node; ``node_up(id)`` is the
        NODE_UP body announcing a node; ``deaths`` numbers each declared death."""
        self.clock = clock
        self._nodes = nodes
        self._recovering = recovering
        self._barriers = barriers
        self._send = send
        self._node_up = node_up
        self._deaths = deaths
        self.first: Rejoin | None = None
        self.unreported: set[int] = set()
        self.early: list[tuple[Member, bytes | None]] = []    # restarts of nodes not found dead yet
        self._held: dict[int, list[tuple[Command, Any, bool]]] = {}
        self._said_down: dict[int, set[int]] = {}           # node -> the reporters that named it down
        self._told: set[tuple[int, int]] = set()            # (node, dead node): its NODE_DOWN was held for it

    def accept(self, body: Any, max_restarts: int, servers: int, workers: int) -> Rejoin | str:
        """A report, or why it is refused: malformed, of another job than this one (its
        DMLC_NUM_SERVER/DMLC_NUM_WORKER, or the first report's), or no restarts in this job."""
        try:
            report = Rejoin.from_body(body)
        except ValueError as exc:
            return str(exc)
        have = (sum(n.role == Role.SERVER for n in report.nodes), sum(n.role == Role.WORKER for n in report.nodes))
        if have != (servers, workers):
            return (f"its node table has {have[0]} servers and {have[1]} workers; this scheduler's job has "
                    f"{servers} and {workers} (DMLC_NUM_SERVER, DMLC_NUM_WORKER)")
        disagree = self.first.agrees(report) if self.first is not None else None
        if disagree:
            return f"it is not of the job the first report described: {disagree}"
        return report if max_restarts else "this scheduler runs without PS_MAX_RESTARTS"

    def begin(self, report: Rejoin, now: float, registered: list[Member]) -> dict[int, Member]:
        """The first report: the job's node table, every node of it yet to report; nodes
        that ``registered`` as new are restarts of nodes of it found dead later."""
        self.first = report
        nodes = {n.node_id: Member(n.role, n.host, n.port, n.addr, None, local=n.local, rank=n.rank, last_seen=now)
                 for n in report.nodes}
        self.unreported = set(nodes)
        self.early += [(member, member.route) for member in registered]
        return nodes

    def hold(self, node_id: int, cmd: Command, body: Any, request: bool) -> bool:
        """Keep a message for a node that has not reported (True), to send once it has."""
        if node_id not in self.unreported:
            return False
        self._held.setdefault(node_id, []).append((cmd, body, request))
        if cmd == Command.NODE_DOWN:
            self._told.add((node_id, body["id"]))
        return True

    def reported(self, node_id: int) -> list[tuple[Command, Any, bool]]:
        """It reported: what was held for it."""
        self.unreported.discard(node_id)
        return self._held.pop(node_id, [])

    def dead(self, node_id: int) -> bool:
        """It was found dead: its restart gets the node table instead of what was held.
        True if it had not reported (it died with the old scheduler)."""
        self._held.pop(node_id, None)
        if node_id not in self.unreported:
            return False
        self.unreported.discard(node_id)
        return True

    def news(self, node_id: int, report: Rejoin) -> None:
        """Its own recovery, and the dead nodes it named or missed."""
        now = self.clock()
        rec = self._recovering.get(node_id)
        if report.recovering:               # a restart that had not finished recovering
            rec = self._recovering.setdefault(node_id, Recovery(now, "restarted before the scheduler",
                                                                death=next(self._deaths)))
            rec.replaced = True
        elif rec is not None:               # others named it down: it is back
            del self._recovering[node_id]
            for other in self._said_down.pop(node_id, set()):
                self._send(other, Command.NODE_UP, self._node_up(node_id))
        nodes = self._nodes()
        for dead, reason in report.down.items():
            if dead not in nodes or dead == node_id:
                continue
            if dead not in self.unreported and dead not in self._recovering:    # it reported: alive
                self._send(node_id, Command.NODE_UP, self._node_up(dead))
                continue
            self._said_down.setdefault(dead, set()).add(node_id)
            if dead not in self._recovering:
                self._recovering[dead] = Recovery(now, reason, death=next(self._deaths))
                self._barriers.died(dead)
        for dead, rec in self._recovering.items():   # news this node missed
            if not rec.replaced and dead not in report.down and dead != node_id and (node_id, dead) not in self._told:
                rec.unacked.add(node_id)
                self._send(node_id, Command.NODE_DOWN, {"id": dead, "reason": rec.reason, "death": rec.death,
                                                        "incarnation": nodes[dead].incarnation,
                                                        "identity": nodes[dead].route})
