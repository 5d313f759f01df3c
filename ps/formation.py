"""The cluster before it forms: who has registered, whose connection went down meanwhile,
who was dropped, and the ranks every node gets once the last one is in.

The scheduler (ps/scheduler.py) owns one :class:`Formation` and hands it every
registration until the cluster forms; after that, only each registration's watch is
kept, until the node's own watch (under its node id) connects. A node
that registers and dies before formation must not be formed into the cluster: its restart
would be refused as one node too many, and the job would start with a corpse. So each
registration's address is watched, a dead one is dropped after a grace, and a newcomer of
a full role takes a dead node's place.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, NamedTuple

from . import ring
from ._timing import DISCONNECT_GRACE
from .config import Config
from .membership import Member, Terms, agreed_terms, assign_ranks, head_count
from .message import Command, Role, server_id, worker_id
from .van import Van

# the scheduler's own lines, under its name as before they moved here (operators grep for it)
logger = logging.getLogger("ps.scheduler")

PENDING_WATCH_IDS = 1 << 24   # watch ids of registered nodes before formation (node ids are small)

# s until the first word about a cluster still forming, then at twice the wait each time: a
# rank that never comes (it crashed, or took another path through the script) is named within
# seconds, while PS_CONNECT_TIMEOUT stays long enough for a slow start
FIRST_REPORT = 5.0

Reply = Callable[[Any, Command, Any], None]


class Formed(NamedTuple):
    """The cluster as it forms: every node by its id, with its rank."""

    nodes: dict[int, Member]
    terms: Terms
    ring: list[int]         # server ranks, each keeping the replica of the one before


class Formation:
    """Registrations until the cluster forms (under the scheduler's lock)."""

    def __init__(self, config: Config, van: Van, clock: Callable[[], float], reply: Reply,
                 on_connection: Callable[[int, bool], None]):
        """``reply(route, cmd, body)`` answers a registering node; ``on_connection`` is
        called by the van with each watched registration's connection state."""
        self.config = config
        self.van = van
        self.clock = clock
        self._reply = reply
        self._on_connection = on_connection
        self.pending: list[Member] = []
        self.started_at = clock()            # the formation deadline counts from here
        self._watches = itertools.count(PENDING_WATCH_IDS)
        self._dropped: list[str] = []        # registered, then dropped: for the timeout error
        self._carried: dict[int, int] = {}   # watch id -> node id once formed, until its own watch connects
        self._next_report = FIRST_REPORT     # s after begin() of the next "still forming" line

    def begin(self) -> None:
        """The scheduler listens: the formation deadline (PS_CONNECT_TIMEOUT) counts from now."""
        self.started_at = self.clock()

    def have(self) -> str:
        return head_count(self.pending, self.config.num_workers, self.config.num_servers)

    def register(self, info: Member) -> bool:
        """Take a registration in: it replaces an earlier one from its address, and a dead
        node's place if its role is full; else it is told (ABORT). True if it was taken."""
        role = info.role.name.lower()
        self._drop([n for n in self.pending if n.addr == info.addr])   # re-registration
        expected = self.config.num_servers if info.role == Role.SERVER else self.config.num_workers
        count = sum(1 for n in self.pending if n.role == info.role)
        if count >= expected:
            # one that registered earlier and died: this is its restart (or its replacement)
            self._replace_dead(info, count - expected + 1)
        if sum(1 for n in self.pending if n.role == info.role) >= expected:
            self._reply(info.route, Command.ABORT, {
                "reason": f"too many {role}s: the job expects {expected} "
                          f"(DMLC_NUM_{'SERVER' if info.role == Role.SERVER else 'WORKER'})"})
            return False
        self.pending.append(info)
        self._watch(info)
        self._reply(info.route, Command.ADD_NODE, {"have": self.have()})
        if self.config.verbose:
            logger.info("scheduler: %s registered from %s (%s)", role, info.addr, self.have())
        return True

    def _watch(self, info: Member) -> None:
        info.registered_at = self.clock()
        if info.addr.startswith(("tcp://", "ipc://")):
            info.watch_id = next(self._watches)
            self.van.watch(info.watch_id, info.addr, self._on_connection)

    def connection(self, watch_id: int, connected: bool) -> None:
        """The watch of a registration saw its connection open (or close, or be refused)."""
        for n in self.pending:
            if n.watch_id == watch_id:
                n.reached = n.reached or connected
                n.down_since = None if connected else (n.down_since or self.clock())

    def complete(self) -> bool:
        """Every node registered and none of them has its connection down (a node that died
        after registering is dropped by :meth:`drop_dead`, or replaced by its restart)."""
        return len(self.pending) == self.config.num_servers + self.config.num_workers \
            and all(n.down_since is None for n in self.pending)

    def _dead(self, n: Member, grace: float, unreached: float | None = None) -> bool:
        """Its connection down (closed, or refused: its port is closed) for ``grace`` s; or,
        given ``unreached``, no answer to the watch that long after it registered."""
        now = self.clock()
        if n.down_since is not None:
            return now - n.down_since >= grace
        return unreached is not None and n.watch_id > 0 and not n.reached and now - n.registered_at >= unreached

    def drop_dead(self) -> None:
        """Registrations whose connection has been down for DISCONNECT_GRACE: the cluster
        waits for others."""
        dead = [n for n in self.pending if self._dead(n, DISCONNECT_GRACE)]
        for n in dead:
            how = "closed its connection" if n.reached else "refused connections"
            logger.warning("scheduler: the %s that registered from %s %s and did not come back within "
                           "%gs; the cluster waits for another", n.role.name.lower(), n.addr, how,
                           DISCONNECT_GRACE)
            self._dropped.append(f"the {n.role.name.lower()} from {n.addr} ({how})")
        self._drop(dead)

    def late(self, now: float) -> str | None:
        """The error once the cluster has not formed within PS_CONNECT_TIMEOUT: who is there,
        who is down, and who was dropped, not only the counts."""
        timeout = self.config.connect_timeout
        if now - self.started_at <= timeout:
            return None
        at = self.clock()
        down = [f"the {n.role.name.lower()} from {n.addr} for {at - n.down_since:.0f}s"
                for n in self.pending if n.down_since is not None]
        return "".join([f"the cluster did not form within {timeout:g}s (PS_CONNECT_TIMEOUT): {self.have()}",
                        f"; connection down: {', '.join(down)}" if down else "",
                        f"; dropped before formation: {', '.join(self._dropped)}" if self._dropped else ""])

    def tick(self, now: float) -> str | None:
        """The scheduler's periodic check before formation: drop the dead, say who is still
        missing, and give the error that ends the job once PS_CONNECT_TIMEOUT has passed."""
        self.drop_dead()
        late = self.late(now)
        if late is None:
            forming = self.still_forming(now)
            if forming is not None:
                logger.warning("scheduler: %s", forming)
        return late

    def still_forming(self, now: float) -> str | None:
        """A line for the log at 5, 10, 20, ... s of waiting: who is missing, and when the
        wait ends. Not an error: a rank may load its data before it makes its store."""
        waited = now - self.started_at
        if waited < self._next_report or waited > self.config.connect_timeout:
            return None
        while self._next_report <= waited:
            self._next_report *= 2
        down = [f"the {n.role.name.lower()} from {n.addr}" for n in self.pending if n.down_since is not None]
        return "".join([f"the cluster has not formed after {waited:.0f}s: {self.have()}",
                        f"; connection down: {', '.join(down)}" if down else "",
                        f". Waiting up to {self.config.connect_timeout:g}s (PS_CONNECT_TIMEOUT)"])

    def _replace_dead(self, info: Member, places: int) -> None:
        """Give up to ``places`` places of ``info``'s role to it: first those of nodes whose
        connection closed, then of nodes the scheduler never reached 1 s after they
        registered (oldest first). Only as many as it needs: one never reached may be alive
        behind a firewall, so it is told (ABORT) rather than left to wait for a table."""
        role = info.role.name.lower()
        dead = sorted((n for n in self.pending if n.role == info.role
                       and self._dead(n, 0.0, unreached=1.0)),
                      key=lambda n: (n.down_since is None, n.registered_at))[:places]
        for n in dead:
            how = ("closed its connection" if n.reached else "refused connections (its port is closed)") \
                if n.down_since is not None else "could not be reached (its connection never opened)"
            logger.warning("scheduler: the %s that registered from %s %s before the cluster formed; the %s "
                           "registering from %s takes its place", role, n.addr, how, role, info.addr)
            self._dropped.append(f"the {role} from {n.addr} ({how})")
            self._reply(n.route, Command.ABORT, {
                "reason": f"this {role} ({n.addr}) {how} as seen from the scheduler, and the {role} "
                          f"registering from {info.addr} took its place"})
        self._drop(dead)

    def _drop(self, members: list[Member]) -> None:
        gone = {id(n) for n in members}
        self.pending = [n for n in self.pending if id(n) not in gone]
        for n in members:
            if n.watch_id:
                self.van.unwatch(n.watch_id)

    def forget_pending(self) -> None:
        """A restarted scheduler rebuilds the job instead: the registrations so far are
        restarts of nodes of it (the scheduler takes them over), no longer watched here."""
        self._drop(list(self.pending))

    def form(self, now: float) -> Formed | str:
        """The ranks of the registered nodes (last seen ``now``), or why they cannot form."""
        terms = agreed_terms(self.pending)
        if isinstance(terms, str):
            return terms
        nodes: dict[int, Member] = {}
        for role, to_id in ((Role.SERVER, server_id), (Role.WORKER, worker_id)):
            members = [n for n in self.pending if n.role == role]
            for rank, info in enumerate(assign_ranks(members)):
                info.rank, info.last_seen = rank, now
                nodes[to_id(rank)] = info
        order = ring.order([nodes[server_id(r)].host for r in range(self.config.num_servers)])
        self._carried = {n.watch_id: i for i, n in nodes.items() if n.watch_id}
        self.pending = []
        return Formed(nodes, terms, order)

    # -- after formation: a registration's watch is kept until the node's own one connects --
    def watch_after(self, watch_id: int, connected: bool) -> int | None:
        """A watch of a registration reported after formation: the node it saw close (a node
        that dies at formation never lets its own watch connect, so only this one can tell),
        and the watch is done; None if there is nothing to tell."""
        node_id = None if connected else self._carried.pop(watch_id, None)
        if node_id is not None:
            self.van.unwatch(watch_id)      # done: a later owner of the port is not this node
        return node_id

    def handed_over(self, node_id: int) -> None:
        """The node's own watch connected: the one from its registration is done."""
        for watch_id in [w for w, n in self._carried.items() if n == node_id]:
            del self._carried[watch_id]
            self.van.unwatch(watch_id)
