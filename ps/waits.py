"""Whether the workers' waits can ever end: the wait-for rule behind PS_DEADLOCK_CHECK.

A sync round closes when every worker that must push it has. Workers that disagree on what
they ask for (another shape, name or operation; a collective one of them skips) each push a
round the others never will, and each waits for its own: nothing closes, nobody times out.
A worker that has waited PS_DEADLOCK_CHECK seconds tells the scheduler what it waits for
(a key and its push number there, or a barrier) and how often it has pushed each key
(ps/waitreport.py); the scheduler decides here whether those waits form a deadlock
(ps/waitjudge.py) and, if so, every worker raises MismatchError naming them.

The rule. A worker whose awaited push every other stuck worker has made is not stuck (its
round closes once those pushes arrive, or something other than a disagreement holds it).
Take them out until none is left to take out; whoever remains waits for a push from a
worker that itself waits for good. It is a deadlock only when that is every live worker: a
worker still computing may yet make the missing push, and is never overruled.

Pure: records and arithmetic, no sockets. Keys are the servers' integer keys; a barrier is
``BARRIER`` and its "pushes" the barriers a worker entered.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Sequence

BARRIER = -1        # the key a worker waiting at a barrier of every worker waits on
RESET = -2          # ... and one that raised a check's MismatchError, for the others to raise it too


class Awaited(NamedTuple):
    """One wait: ``key``'s round of push number ``seq`` (a pull: the round of this worker's
    last push), which only ``members`` push (empty: every worker); ``what``, as the script
    knows it (``allreduce of 'w' (3, 4) float32``)."""
    key: int
    seq: int
    what: str
    members: tuple[int, ...] = ()

    def to_body(self) -> list:
        return [self.key, self.seq, self.what, list(self.members)]

    @classmethod
    def from_body(cls, body: Sequence) -> "Awaited":
        key, seq, what, members = body
        return cls(int(key), int(seq), str(what), tuple(int(m) for m in members))


class Report(NamedTuple):
    """What a blocked worker tells the scheduler. ``episode`` counts this worker's blocked
    spells (a report of an earlier one is stale); ``version`` changes with every push it
    makes, so two reports of one version a period apart show a worker that pushes nothing
    meanwhile; ``pushes``: key -> pushes this worker has made to it (rounds it is in)."""
    rank: int
    episode: int
    version: int
    awaited: tuple[Awaited, ...]
    pushes: dict[int, int]

    def to_body(self) -> dict[str, Any]:
        return {"rank": self.rank, "episode": self.episode, "version": self.version,
                "awaited": [a.to_body() for a in self.awaited], "pushes": [[k, n] for k, n in self.pushes.items()]}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Report":
        return cls(int(body["rank"]), int(body["episode"]), int(body["version"]),
                   tuple(Awaited.from_body(a) for a in body["awaited"]),
                   {int(k): int(n) for k, n in body["pushes"]})


def lacking(wait: Awaited, reports: dict[int, Report], among: Iterable[int]) -> list[int]:
    """The ranks of ``among`` that must push ``wait``'s round and have not (yet)."""
    return [r for r in among if (not wait.members or r in wait.members) and reports[r].pushes.get(wait.key, 0) < wait.seq]


def stuck(reports: dict[int, Report]) -> set[int]:
    """The ranks whose waits can never end, given these reports (rank -> report)."""
    left = set(reports)
    changed = True
    while changed:
        changed = False
        for rank in sorted(left):
            if not any(lacking(w, reports, left) for w in reports[rank].awaited):
                left.discard(rank)
                changed = True
    return left


def explain(reports: dict[int, Report]) -> str:
    """The MismatchError text every worker raises: what each waits for, and who has not
    started it."""
    lines = []
    for rank in sorted(reports):
        for wait in reports[rank].awaited:
            missing = lacking(wait, reports, reports)
            if missing:
                who = ", ".join(str(r) for r in missing)
                lines.append(f"rank {rank} waits for {wait.what}, which rank{'s' if len(missing) > 1 else ''} "
                             f"{who} did not start")
                break
    return ("the workers disagree on what they do next, so none of their waits can end: " + "; ".join(lines) +
            ". Every worker must run the same collectives (names, shapes, dtypes, operations, process sets) in "
            "an order that lets each complete")
