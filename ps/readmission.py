"""The scheduler's side of restarts (PS_MAX_RESTARTS): a dead node awaited instead of
ending the job, its restart parked until every live node has acted on the death, then
admitted into the dead node's place (its id, rank and the current node table), and
announced back once it has recovered its state.

Why a restart waits for the acknowledgements: with lost messages resent late, the
restart's first messages could reach a node before the news of the death, which would
then wipe them. A node that never acknowledges is dead or stuck itself; after ACK_WAIT
the restart joins anyway.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Protocol

from .barriers import GROUPS, Barriers
from .config import Config
from .membership import (
    Member,
    Parked,
    Recovery,
    Terms,
    breaks_terms,
    process_of,
    restart_place,
)
from .message import Command, Message, Role, node_name
from .rebuild import Rebuild
from .van import Van

# the scheduler's own lines, under its name (operators grep for it)
logger = logging.getLogger("ps.scheduler")

# seconds a registered restart waits for the live nodes to acknowledge its dead self's death
# (a node that never does is dead itself, or stuck: heartbeats deal with it)
ACK_WAIT = 5.0


class Host(Protocol):
    """What restarts need of the scheduler (ps/scheduler.py), under its lock."""

    config: Config
    clock: Callable[[], float]
    van: Van
    nodes: dict[int, Member]
    terms: Terms
    down_since: dict[int, float]
    closed_workers: set[int]
    barriers: Barriers
    rebuild: Rebuild
    error: str | None

    @property
    def ended(self) -> bool: ...
    def send_to(self, node_id: int, cmd: Command, body: Any = None, request: bool = False) -> None: ...
    def reply(self, route: bytes | None, cmd: Command, body: Any = None, recver: int = 0,
              request: bool = False) -> None: ...
    def describe(self, node_id: int) -> str: ...
    def have(self) -> str: ...
    def table(self) -> dict[str, Any]: ...
    def watch(self, nodes: dict[int, Member]) -> None: ...
    def gone(self, node_id: int) -> bool: ...
    def node_failed(self, node_id: int, reason: str, final: bool = False) -> None: ...


class Readmission:
    """Dead nodes awaited and their restarts admitted (under the scheduler's lock)."""

    def __init__(self, host: Host):
        self.host = host
        self.recovering: dict[int, Recovery] = {}   # node id -> its awaited restart
        self.restarts = 0                           # restarted nodes that registered
        self.process_restarts = 0                   # ... counted by process (PS_MAX_RESTARTS' unit)
        self._restarted: set[tuple[str, int]] = set()
        self.deaths = itertools.count(1)            # numbers each declared death (Recovery.death)

    def node_down(self, node_id: int, reason: str) -> None:
        """A node died and may come back: everyone else waits for it instead of failing."""
        node = self.host.nodes[node_id]
        self.recovering[node_id] = Recovery(self.host.clock(), reason, death=next(self.deaths))
        self.host.barriers.died(node_id)
        self.host.down_since.pop(node_id, None)
        if node.route is not None:
            self.host.van.forget(node.route)
        logger.warning("scheduler: %s; waiting up to %gs for its restart (PS_MAX_RESTARTS=%d, %d used)",
                       reason, self.host.config.connect_timeout, self.host.config.max_restarts,
                       self.process_restarts)
        rec = self.recovering[node_id]
        body = {"id": node_id, "reason": reason, "death": rec.death, "incarnation": node.incarnation,
                "identity": node.route}     # the others stop hearing the dead process too
        for other in self.host.nodes:
            if other != node_id and not self.host.gone(other) and self.reachable(other):
                self.host.send_to(other, Command.NODE_DOWN, body)
                rec.unacked.add(other)
        for other_id, other in list(self.recovering.items()):     # it cannot acknowledge any more
            if node_id in other.unacked:
                other.unacked.discard(node_id)
                self.admit_if_acked(other_id)
        if self.host.rebuild.dead(node_id):     # died with the old scheduler: its restart replays as the others
            self.host.barriers.estimate(node_id, [g for g, roles in GROUPS.items() if node.role in roles],
                                    self.host.rebuild.unreported)
        self.retry_early()

    def on_node_down_ack(self, msg: Message) -> None:
        """A node acted on a NODE_DOWN (forgot the dead node's channels and rounds)."""
        node_id = msg.body.get("id") if isinstance(msg.body, dict) else None
        rec = self.recovering.get(node_id) if isinstance(node_id, int) else None
        if rec is not None and msg.body.get("death") == rec.death:     # not a late one for an earlier death
            rec.unacked.discard(msg.sender)
            self.admit_if_acked(node_id)

    def admit_if_acked(self, node_id: int, force: bool = False) -> None:
        rec = self.recovering.get(node_id)
        if rec is None or rec.parked is None:
            return
        rec.unacked = {i for i in rec.unacked if not self.host.gone(i) and self.reachable(i)}
        if rec.unacked and not force:
            return
        if rec.unacked:
            logger.warning("scheduler: %s did not acknowledge the death of %s within %gs; its restart "
                           "joins anyway", ", ".join(self.host.describe(i) for i in sorted(rec.unacked)),
                           node_name(node_id), ACK_WAIT)
        parked, rec.parked = rec.parked, None
        self._admit(node_id, parked.info, parked.route)

    def reachable(self, node_id: int) -> bool:
        """Alive or restarted: a node awaiting its restart gets nothing (its restart learns
        who is down from its node table), a restart still recovering gets news of the others,
        and its own death is noticed like anyone's (killed while it recovers, it is awaited
        again; before, its next restart was refused and the job ended)."""
        rec = self.recovering.get(node_id)
        return rec is None or rec.replaced

    def take_over(self, info: Member, route: bytes | None) -> None:
        """A node registering after formation is the restart of a dead node of its role."""
        role = info.role.name.lower()
        broken = breaks_terms(self.host.terms, info)
        if broken:
            logger.warning("scheduler: refused a restart: %s", broken)
            self.host.reply(route, Command.ABORT, {"reason": broken})
            return
        for node_id, since in list(self.host.down_since.items()):   # died moments ago, not yet declared
            if self.host.nodes[node_id].role == info.role and self.reachable(node_id):
                self.host.node_failed(node_id, f"{self.host.describe(node_id)} closed its connection and a new "
                                  f"{role} registered from {info.host}")
                if self.host.ended:
                    self.host.reply(route, Command.ABORT, {"reason": self.host.error or "the job failed"})
                    return
        free = [i for i, r in self.recovering.items()
                if not r.replaced and r.parked is None and self.host.nodes[i].role == info.role]
        if not free and any(self.host.nodes[i].role == info.role for i in self.host.rebuild.unreported):
            self.host.rebuild.early.append((info, route))   # its dead self is not found dead yet
            return
        if not free:
            self.host.reply(route, Command.ABORT, {
                "reason": f"the cluster is already complete ({self.host.have()}) and no {role} is awaiting "
                          f"its restart; a {role} at {info.host}:{info.port} tried to join late"})
            return
        node_id = restart_place(info, free, self.host.nodes)
        self.recovering[node_id].parked = Parked(info, route, self.host.clock())
        self.admit_if_acked(node_id)

    def _admit(self, node_id: int, info: Member, route: bytes | None) -> None:
        """The restart takes the dead node's place: its id, rank and the current node table."""
        role = info.role.name.lower()
        old = self.host.nodes[node_id]
        info.rank, info.last_seen = old.rank, self.host.clock()
        self.host.nodes[node_id] = info
        self.recovering[node_id].replaced = True
        self.restarts += 1
        if process_of(info, node_id) not in self._restarted:     # a joint process's second node: counted once
            self._restarted.add(process_of(info, node_id))
            self.process_restarts += 1
        info.incarnation = self.restarts            # its NODE_TABLE's "restart", which it says it is
        self.host.barriers.replay(node_id)
        down = {str(i): r.reason for i, r in self.recovering.items() if i != node_id}
        self.host.reply(route, Command.ADD_NODE, {"have": self.host.have()})
        self.host.send_to(node_id, Command.NODE_TABLE, {**self.host.table(), "you": node_id, "restart": self.restarts,
                                                    "down": down})
        self.host.watch({node_id: info})
        logger.warning("scheduler: %s registered from %s as the restart of %s (restart %d of %d); "
                       "it recovers its state", role, info.addr, node_name(node_id), self.process_restarts,
                       self.host.config.max_restarts)

    def on_rejoined(self, msg: Message) -> None:
        rec = self.recovering.get(msg.sender)
        if rec is None or not rec.replaced:
            return
        error = msg.body.get("error") if isinstance(msg.body, dict) else None
        if error:
            self.host.node_failed(msg.sender, f"{self.host.describe(msg.sender)} could not recover: {error}", final=True)
            return
        del self.recovering[msg.sender]
        logger.warning("scheduler: %s is back after %.1fs (restart %d of %d)", self.host.describe(msg.sender),
                       self.host.clock() - rec.since, self.process_restarts, self.host.config.max_restarts)
        if self.host.nodes[msg.sender].role == Role.SERVER:
            # its dead self knew which workers closed their stores: rounds missing their pushes fail
            for wid in sorted(self.host.closed_workers):
                self.host.send_to(msg.sender, Command.WORKER_CLOSED, {"rank": self.host.nodes[wid].rank, "id": wid})
        body = self.node_up(msg.sender)
        for other in self.host.nodes:
            if other != msg.sender and not self.host.gone(other) and self.reachable(other):
                self.host.send_to(other, Command.NODE_UP, body)

    def node_up(self, node_id: int) -> dict[str, Any]:
        return {"row": self.host.nodes[node_id].node(node_id).to_row(), "restart": self.restarts}

    def retry_early(self) -> None:
        """Restarts that registered before their dead self was found dead take its place now."""
        early, self.host.rebuild.early = self.host.rebuild.early, []
        for member, route in early:
            self.take_over(member, route)
