"""What the scheduler records of a job's nodes: each one as it registered and lives
(:class:`Member`), the ranks it gives them (:func:`assign_ranks`), and the waits it keeps
for them: open barriers, dead nodes awaiting their restart, restarts replaying their start.
Records and pure functions; the scheduler (ps/scheduler.py) moves them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from . import ring
from .message import Node, Role, node_name

logger = logging.getLogger(__name__)


@dataclass
class Barrier:
    """One open barrier: who has arrived, since when, whether its stall was reported."""

    since: float
    arrived: set[int]
    warned: bool = False


@dataclass
class Recovery:
    """A dead node whose restart the job waits for (PS_MAX_RESTARTS)."""

    since: float
    reason: str
    replaced: bool = False            # its restart registered and is recovering its state
    # the live nodes told of its death that have not said they acted on it: its restart gets
    # its node table only once they have (else, with lost messages resent late, the restart's
    # first messages could reach a node before the news of the death, which then wipes them)
    unacked: set[int] = field(default_factory=set)
    parked: Parked | None = None      # a restart waiting for those
    death: int = 0      # which declared death this is: an acknowledgement names the one it acts on


class Parked(NamedTuple):
    """A restart that registered, waiting for the live nodes to act on its dead self's death."""

    info: Member
    route: bytes | None
    since: float


class Awaited(NamedTuple):
    """A dead node whose restart has not registered yet, for the launcher: a process it still
    sees running under that name is unreachable (its host is down), not alive."""

    role: str           # "server" or "worker"
    rank: int
    waited: float       # seconds since the scheduler declared it dead
    lived: float        # seconds since it registered: a process started after that is a restart
    reason: str


@dataclass
class Replay:
    """A restarted node re-running its start (and a worker its script): the barriers its dead
    self passed are answered at once (the others passed them long ago)."""

    passed: dict[str, int]
    done: dict[str, int]


@dataclass
class Member:
    """A node as the scheduler knows it: what it registered with, then its rank and liveness."""

    role: Role
    host: str
    port: int
    addr: str
    route: bytes | None = None        # the ROUTER identity its messages arrive from: replies go there
    rank_hint: int | None = None
    sync: bool = True
    local: list | None = None
    pid: int | None = None
    hostname: str = ""
    rank: int = -1
    last_seen: float = 0.0
    incarnation: int = 0        # the job's restart count when it was admitted (0: formed with the job)
    # before formation: the id its connection is watched under (0: not watched), when it
    # registered, whether the watch ever connected, since when it is down (None: up)
    watch_id: int = 0
    registered_at: float = 0.0
    reached: bool = False
    down_since: float | None = None
    chunk: int = 0              # a worker's PS_CHUNK_BYTES: how it cuts its pushes (0: not said)

    @classmethod
    def from_registration(cls, body: Any, route: bytes | None) -> "Member":
        """Raises ValueError naming what is wrong with a registration."""
        if not isinstance(body, dict):
            raise ValueError(f"registration is not a map: {body!r:.100}")
        try:
            role = Role(body["role"])
            member = cls(role, str(body["host"]), int(body["port"]), str(body["addr"]), route,
                         body.get("rank_hint"), bool(body.get("sync", True)), body.get("local"),
                         body.get("pid"), str(body.get("hostname", "")), chunk=int(body.get("chunk") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None
        if role == Role.SCHEDULER:
            raise ValueError("a second scheduler")
        return member

    def node(self, node_id: int) -> Node:
        return Node(node_id, self.role, self.rank, self.host, self.port, self.addr, self.local)

    def describe(self, node_id: int) -> str:
        """How messages name it: ``worker 1 (W[11] at 10.0.0.2:9001)``."""
        return f"{self.role.name.lower()} {self.rank} ({node_name(node_id)} at {self.host}:{self.port})"


class Terms(NamedTuple):
    """What every worker of a job says alike, at formation and when one restarts: a worker
    of another kvstore type, or cutting its pushes into other chunks (a server sums the same
    chunks of every worker), would make every sum wrong or fail."""

    sync: bool
    chunk: int = 0      # PS_CHUNK_BYTES (0: no worker said: a job of servers, or one of tests)

    @property
    def kind(self) -> str:
        return kvstore_kind(self.sync)


def kvstore_kind(sync: bool) -> str:
    return "dist_sync" if sync else "dist_async"


def agreed_terms(members: list[Member]) -> Terms | str:
    """The terms the registered workers agree on, or why they cannot form one job."""
    workers = [m for m in members if m.role == Role.WORKER]
    syncs = {m.sync for m in workers}
    if len(syncs) > 1:
        return ("workers disagree on the kvstore type: some asked for dist_sync, others for "
                "dist_async; every worker must create the same type")
    cuts: dict[int, list[str]] = {}
    for m in workers:
        if m.chunk:
            cuts.setdefault(m.chunk, []).append(m.addr)
    if len(cuts) > 1:
        who = "; ".join(f"{c} at {', '.join(sorted(addrs))}" for c, addrs in sorted(cuts.items()))
        return (f"workers disagree on PS_CHUNK_BYTES ({who}): a server sums the same chunks of every "
                "worker; set the same value on every worker")
    return Terms(syncs.pop() if syncs else True, next(iter(cuts), 0))


def breaks_terms(terms: Terms, member: Member) -> str | None:
    """Why a worker registering as a restart cannot take a place in a job of ``terms``, or None."""
    if member.role != Role.WORKER:
        return None
    if member.sync != terms.sync:
        return (f"the worker restarting from {member.addr} asked for {kvstore_kind(member.sync)}, and the job "
                f"is {terms.kind}; every worker must create the same type")
    if member.chunk and terms.chunk and member.chunk != terms.chunk:
        return (f"the worker restarting from {member.addr} has PS_CHUNK_BYTES={member.chunk}, and the job's "
                f"workers {terms.chunk}: a server sums the same chunks of every worker; restart it with "
                f"PS_CHUNK_BYTES={terms.chunk}")
    return None


def process_of(member: Member, node_id: int) -> tuple[str, int]:
    """The process a node runs in: a joint process (DMLC_ROLE=joint) is a server and a worker."""
    return (member.hostname, member.pid) if member.pid else ("", -node_id)


def unrecoverable(node_id: int, nodes: dict[int, Member], recovering: dict[int, Recovery], restarts: int,
                  limit: int, num_servers: int, order: list[int]) -> str | None:
    """Why the death of ``node_id`` cannot be recovered from (PS_MAX_RESTARTS ``limit``,
    ``restarts`` of processes used, ``recovering`` awaited, the replica ring's ``order``); None
    if it can. The limit counts processes, as the launcher restarts them: a joint process's
    server and worker die and come back as one."""
    node = nodes[node_id]
    awaited = {process_of(nodes[i], i) for i, rec in recovering.items() if not rec.replaced}
    if process_of(node, node_id) not in awaited and restarts + len(awaited) >= limit:
        return f"the job has used all of its {limit} restart(s) (PS_MAX_RESTARTS / --max-restarts)"
    if node.role == Role.SERVER and num_servers < 2:
        return ("with one server there is no replica of its state to recover from "
                "(server recovery needs DMLC_NUM_SERVER >= 2)")
    if node.role != Role.SERVER:
        return None     # workers hold no state: any number may be down, with servers too
    # Each server keeps the only copy of the one before it in the ring (ps/ring.py): two
    # neighbours down at once leave one of them without a copy. Servers further apart
    # recover together, so a machine can die with all of its servers (the ring puts
    # neighbours on different hosts wherever it can).
    near = ring.neighbours(order, node.rank)
    lost = [i for i in recovering if nodes[i].role == Role.SERVER and nodes[i].rank in near]
    if lost:
        others = ", ".join(nodes[i].describe(i) for i in lost)
        return (f"it failed while {others}, its neighbour in the replica ring, was still recovering: "
                f"each server keeps the only copy of the one before it, so one of the two has no copy left")
    return None


def node_state(node_id: int, failed: dict[int, str], recovering: dict[int, Recovery], closed: set[int],
               ended: bool) -> tuple[str, str | None]:
    """What the dashboard says of a node, and why: dead (its death ended the job, or its
    restart has not registered), restarting, closed (a worker that closed its store), ended
    or alive."""
    rec = recovering.get(node_id)
    reason = failed.get(node_id) or (rec.reason if rec is not None else None)
    if node_id in failed or (rec is not None and not rec.replaced):
        return "dead", reason
    if rec is not None:
        return "restarting", reason
    return ("closed" if node_id in closed else "ended" if ended else "alive"), reason


def head_count(nodes: list[Member], num_workers: int, num_servers: int) -> str:
    """How far a job is from complete, as its messages say it: with the ranks still missing
    when every node of a role asked for its rank (DMLC_RANK: every launcher, mpirun's ranks),
    so that the error names the process to look at."""
    counts = []
    for role, expected in ((Role.WORKER, num_workers), (Role.SERVER, num_servers)):
        members = [n for n in nodes if n.role == role]
        text = f"{len(members)}/{expected} {role.name.lower()}s"
        hints = {n.rank_hint for n in members}
        if members and len(members) < expected and None not in hints:
            missing = [r for r in range(expected) if r not in hints]
            text += f" (missing rank{'s' if len(missing) != 1 else ''} {', '.join(map(str, missing[:16]))}" + \
                    (", ...)" if len(missing) > 16 else ")")
        counts.append(text)
    return "have " + ", ".join(counts)


def restart_place(info: Member, free: list[int], nodes: dict[int, Member]) -> int:
    """Which of the ``free`` places (dead nodes of its role) a registering restart takes: the
    rank it asks for (DMLC_RANK: the launcher's restart of that rank, wherever it now runs),
    else one that died on its host, else any."""
    hinted = [i for i in free if info.rank_hint is not None and nodes[i].rank == info.rank_hint]
    same_host = [i for i in free if nodes[i].hostname == info.hostname]
    return (hinted or same_host or free)[0]


def placement_warning(nodes: list[Member]) -> str | None:
    """The commonest way to make a multi-machine job slow (issue trackers: "1 server + 2
    workers, half the performance"): fewer machines with servers than machines with workers,
    so the servers' links carry what every worker sends and receives."""
    worker_hosts = sorted({n.host for n in nodes if n.role == Role.WORKER})
    server_hosts = sorted({n.host for n in nodes if n.role == Role.SERVER})
    if len(worker_hosts) < 2 or len(server_hosts) >= len(worker_hosts):
        return None
    return (f"workers run on {len(worker_hosts)} hosts, servers on only {len(server_hosts)} "
            f"({', '.join(server_hosts)}): each server host's link carries its share of every worker's "
            f"pushes and pulls. On links of equal speed a job is fastest with servers on as many hosts as "
            f"workers (one server on each worker host: docs/multihost.md, \"How many servers?\")")


def assign_ranks(nodes: list[Member]) -> list[Member]:
    """Order nodes of one role by rank: valid, unique ``rank_hint``s first, the rest as
    ps-lite (host descending, then port ascending) so reruns give the same ranks."""
    n = len(nodes)
    hinted: dict[int, Member] = {}
    rest = []
    for node in nodes:
        hint = node.rank_hint
        if isinstance(hint, int) and 0 <= hint < n and hint not in hinted:
            hinted[hint] = node
        else:
            if hint is not None:
                logger.warning("ignoring rank hint %r of %s (out of range or taken)", hint, node.addr)
            rest.append(node)
    rest.sort(key=lambda d: d.port)
    rest.sort(key=lambda d: d.host, reverse=True)
    free = iter(r for r in range(n) if r not in hinted)
    order = dict(hinted)
    for node in rest:
        order[next(free)] = node
    return [order[r] for r in range(n)]


class Death(NamedTuple):
    """A node found dead by the scheduler's periodic check, and why."""

    node_id: int
    reason: str
    final: bool         # its restart was awaited and did not come (no restart for it)


def find_death(now: float, nodes: dict[int, Member], recovering: dict[int, Recovery], down_since: dict[int, float],
               alive: Callable[[int], bool], connect_timeout: float, heartbeat_timeout: float,
               disconnect_grace: float) -> Death | None:
    """The first node found dead at ``now``, or None: a restart awaited longer than
    PS_CONNECT_TIMEOUT, a connection closed for ``disconnect_grace``, or heartbeats missing
    for PS_HEARTBEAT_TIMEOUT (0: not checked). ``alive(id)``: counted (neither gone on
    purpose nor awaiting its restart)."""
    for node_id, rec in recovering.items():
        if now - rec.since > connect_timeout:
            state = "did not finish recovering" if rec.replaced else "was not restarted"
            return Death(node_id, f"{rec.reason}; it {state} within {connect_timeout:g}s (PS_CONNECT_TIMEOUT)", True)
    for node_id, since in down_since.items():
        if alive(node_id) and now - since > disconnect_grace:
            return Death(node_id, f"{nodes[node_id].describe(node_id)} closed its connection and did not come back "
                         f"within {disconnect_grace:g}s (process died?)", False)
    for node_id, node in nodes.items():
        silent = now - node.last_seen
        if heartbeat_timeout and alive(node_id) and silent > heartbeat_timeout:
            return Death(node_id, f"{node.describe(node_id)} sent no heartbeat for {silent:.1f}s "
                         f"(PS_HEARTBEAT_TIMEOUT={heartbeat_timeout:g}); presumed dead", False)
    return None
