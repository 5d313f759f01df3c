"""What a live node tells a restarted scheduler, so that the job goes on without it.

The scheduler keeps no state on disk. When its process dies (a killed pod, an evicted
one, a lost machine) and is started again at the same address, the servers and workers
are still running and hold everything it knew between them: every node holds the node
table, the kvstore type, the workers' chunk size and the replica ring; each knows the
barriers it passed and the ones it waits in, which nodes it was told are down, whether it
is itself a restart still recovering, whether (a worker) it closed its store; and the
servers know which workers closed. Each node sends this once, as a registration that
carries its node id (:class:`Rejoin`), and the new scheduler rebuilds the job from the
reports (ps/scheduler.py). Nothing here moves data: pushes and pulls between workers and
servers go on while the scheduler is away.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .message import Node, Role

KEY = "rejoin"      # a registration carrying this is a live node's report, not a new node


@dataclass
class Rejoin:
    """One live node's report (the ``"rejoin"`` part of its ADD_NODE body)."""

    node_id: int
    rank: int
    nodes: list[Node]               # its node table, its own row with the address it has now
    sync: bool
    ring: list[int]
    incarnation: int                # the job's restart count when it was admitted (0: formed with the job)
    down: dict[int, str] = field(default_factory=dict)      # nodes it was told are down, awaiting restart
    closed_workers: list[int] = field(default_factory=list)  # workers a server was told closed their store
    waiting: list[str] = field(default_factory=list)        # barrier groups it waits in now
    passed: dict[str, int] = field(default_factory=dict)    # barriers it passed, per group
    recovering: bool = False        # a restart that has not reported its recovery (REJOINED) yet
    closed: bool = False            # a worker that closed its store (its CLOSE may not have arrived)
    chunk: int = 0                  # the workers' PS_CHUNK_BYTES (0: none said)

    def to_body(self) -> dict[str, Any]:
        return {"id": self.node_id, "rank": self.rank, "nodes": [n.to_row() for n in self.nodes],
                "sync": self.sync, "ring": list(self.ring), "incarnation": self.incarnation,
                "down": {str(k): v for k, v in self.down.items()}, "closed_workers": list(self.closed_workers),
                "waiting": list(self.waiting), "passed": dict(self.passed), "recovering": self.recovering,
                "closed": self.closed, "chunk": self.chunk}

    @classmethod
    def from_body(cls, body: Any) -> "Rejoin":
        """Raises ValueError naming what is wrong with a report."""
        if not isinstance(body, dict):
            raise ValueError(f"a rejoin report is not a map: {body!r:.100}")
        try:
            report = cls(int(body["id"]), int(body["rank"]), [Node.from_row(r) for r in body["nodes"]],
                         bool(body["sync"]), [int(r) for r in body["ring"]], int(body["incarnation"]),
                         {int(k): str(v) for k, v in body.get("down", {}).items()},
                         [int(i) for i in body.get("closed_workers", [])],
                         [str(g) for g in body.get("waiting", [])],
                         {str(g): int(n) for g, n in body.get("passed", {}).items()},
                         bool(body.get("recovering", False)), bool(body.get("closed", False)),
                         int(body.get("chunk", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a malformed rejoin report ({type(exc).__name__}: {exc})") from None
        ids = {n.node_id for n in report.nodes}
        if report.node_id not in ids:
            raise ValueError(f"a rejoin report from node {report.node_id}, which its own node table lacks")
        if any(n.role == Role.SCHEDULER for n in report.nodes):
            raise ValueError("a rejoin report whose node table holds a scheduler")
        return report

    def agrees(self, other: "Rejoin") -> str | None:
        """Why two reports cannot be of one job (another job's node at this address), or None."""
        mine = sorted((n.node_id, int(n.role), n.rank) for n in self.nodes)
        theirs = sorted((n.node_id, int(n.role), n.rank) for n in other.nodes)
        if mine != theirs:
            return "their node tables name different nodes"
        if self.sync != other.sync:
            return "one is dist_sync and the other dist_async"
        if self.chunk and other.chunk and self.chunk != other.chunk:
            return f"one says PS_CHUNK_BYTES={self.chunk} and the other {other.chunk}"
        return None
