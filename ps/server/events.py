"""What a server journals for its backup (:class:`Event`), and the two records of workers
that both copies move by the same events: restarted workers replaying their scripts
(:class:`Replays`) and workers in Horovod's join (:class:`Joins`).

Kept apart from the store so that the backup's replay (ps/server/replica.py) reads the same
records the primary's Store writes, with no store of its own.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Event(NamedTuple):
    """One change of this store, as a backup replays it (ps/server/replica.py): ``kind`` is
    init, chunk (a chunk sum of the open round, applied at its close), close, whole (a
    non-elementwise round's full sum), rows, dense, async, arows; and, for restarted
    workers, died, caught_up and setting (their settings counted). The optimizer's events
    (opt, states, params) carry its namespace in ``key``; ns (keys moved to a namespace)
    carries the namespace there and the keys in ``info``."""

    kind: str
    key: int
    offset: int = 0
    info: Any = None
    arrays: tuple = ()


@dataclass
class Replays:
    """Restarted workers re-running their scripts, as one server sees them: who still replays
    (until it pushes something new), and per (worker, setting command) how many were applied
    from it and how many its restart sent again, with the id of the last one counted (a
    resend of that one is not counted twice). A store keeps one and a backup's copy of it
    another (ps/server/replica.py), both moved by the same events: died, caught_up, setting."""

    replaying: set[int] = field(default_factory=set)
    applied: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    replayed: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    last: dict[int, int] = field(default_factory=dict)

    def apply(self, ev: Event) -> None:
        if ev.kind == "died":           # its restart replays from its script's start, ids from 1
            worker = int(ev.info)
            self.replaying.add(worker)
            for key in [k for k in self.replayed if k[0] == worker]:
                del self.replayed[key]
            self.last.pop(worker, None)
        elif ev.kind == "caught_up":
            self.replaying.discard(int(ev.info))
        elif ev.kind == "setting":
            worker, cmd, how, cid = ev.info
            counts = self.applied if how == "applied" else self.replayed
            counts[(int(worker), str(cmd))] += 1
            if isinstance(cid, int):
                self.last[int(worker)] = max(cid, self.last.get(int(worker), 0))
        else:
            raise ValueError(f"not an event about restarted workers: {ev.kind!r}")

    def info(self) -> dict[str, Any]:
        """As the "workers" event of a snapshot carries it (msgpack: no tuple keys)."""
        return {"replaying": sorted(self.replaying),
                "applied": [[w, cmd, n] for (w, cmd), n in self.applied.items()],
                "replayed": [[w, cmd, n] for (w, cmd), n in self.replayed.items()],
                "last": [[w, cid] for w, cid in self.last.items()]}

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Replays:
        def counts(rows: Any) -> collections.Counter[tuple[int, str]]:
            return collections.Counter({(int(w), str(cmd)): int(n) for w, cmd, n in rows})
        return cls({int(w) for w in info["replaying"]}, counts(info["applied"]), counts(info["replayed"]),
                   {int(w): int(cid) for w, cid in info["last"]})


@dataclass
class Joins:
    """Workers in Horovod's join (KVStore.join) as one server sees them: who joined, in join
    order (the last to join is every worker's answer), and per worker the answer to its last
    leave, given again to a leave resent to this server's restart. A store keeps one and a
    backup's copy another (ps/server/replica.py), both moved by the same events: join, leave. The
    rounds each key closed without a joined worker are the key's (``KeyState.excused``)."""

    joined: dict[int, None] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    left: dict[int, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)

    def apply(self, ev: Event) -> None:
        if ev.kind == "join":
            worker = int(ev.info)
            self.left.pop(worker, None)
            if worker not in self.joined:
                self.joined[worker] = None
                self.order.append(worker)
        elif ev.kind == "leave":
            worker, last, skipped = ev.info
            self.joined.pop(int(worker), None)
            if not self.joined:
                self.order.clear()
            self.left[int(worker)] = (int(last), [(int(k), int(n)) for k, n in skipped])
        else:
            raise ValueError(f"not an event about joined workers: {ev.kind!r}")

    def info(self) -> dict[str, Any]:
        """As the "joins" event of a snapshot carries it."""
        return {"joined": list(self.joined), "order": list(self.order),
                "left": [[w, last, [list(p) for p in skipped]] for w, (last, skipped) in self.left.items()]}

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Joins:
        return cls(dict.fromkeys(int(w) for w in info["joined"]), [int(w) for w in info["order"]],
                   {int(w): (int(last), [(int(k), int(n)) for k, n in skipped]) for w, last, skipped in info["left"]})
