"""Who must push to a key's sync round before it closes (:class:`Quorum`), and who never will.

Every worker, unless the key is pushed only by some (a Horovod process set:
``Store.set_members``); less the workers in Horovod's join, which a round pushed JOINABLE
closes without (their share zero) and any other round they are needed in fails for
(``Store.join``); and a worker that closed its store will push nothing again, so a round
still missing its push fails. The Store asks; the Quorum holds that state and moves by the
same events the Store journals for its backup (members, join, leave; a snapshot's joins),
so a restored store goes on with the quorum its dead self had. It reads rounds, never
changes them: closing and failing them is the Store's.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

from ..message import id_to_rank, node_name, worker_id
from .events import Event, Joins
from .rounds import Round


class Refusal(NamedTuple):
    """Why a request is refused or a round can never complete: an error reply's kind and text."""

    kind: str
    text: str


def who(worker: int) -> str:
    """A worker as an error message names it."""
    return f"worker {id_to_rank(worker)} ({node_name(worker)})"


class Quorum:
    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.members: dict[int, frozenset[int]] = {}   # key -> the only workers that push it
        self.joins = Joins()                           # in the replica (ps/server/events.py)
        self.closed: set[int] = set()                  # workers that closed their store
        # the usual case, asked on every chunk and round close: every key waits for every
        # worker and nobody joined, so a count of pushes decides
        self.plain = True
        # a worker closed its store or joined, so it pushes no more: a round may be doomed
        # (asked at every close)
        self.some_stopped = False

    def apply(self, ev: Event) -> None:
        """A change the Store journals (members, join, leave), or a snapshot's joins."""
        if ev.kind == "members":
            group = frozenset(int(w) for w in ev.info[1])
            self.members.update((int(k), group) for k in ev.info[0])
        elif ev.kind == "joins":
            self.joins = Joins.from_info(ev.info)
        else:
            self.joins.apply(ev)
        self.plain = not (self.members or self.joins.joined)
        self.some_stopped = bool(self.closed or self.joins.joined)

    def close(self, worker: int) -> None:
        """``worker`` closed its store: it pushes nothing more."""
        self.closed.add(worker)
        self.some_stopped = True

    # -- who pushes what ---------------------------------------------------------------------
    def group(self, keys: list[int], workers: list[int]) -> tuple[list[int], frozenset[int]]:
        """Of ``keys``, those not yet pushed by just ``workers`` alone, and that group. Raises
        RuntimeError unless ``workers`` is a non-empty set of this job's workers."""
        group = frozenset(workers)
        if not group or not group <= set(self.all_workers()):
            raise RuntimeError(f"cannot restrict keys to workers {sorted(id_to_rank(w) for w in workers)}: not a "
                               f"non-empty set of this job's {self.num_workers} workers")
        return [k for k in keys if self.members.get(k) != group], group

    def all_workers(self) -> list[int]:
        return [worker_id(r) for r in range(self.num_workers)]

    def required(self, key: int) -> Iterable[int]:
        group = self.members.get(key)
        return self.all_workers() if group is None else group

    def needed(self, key: int) -> int:
        """How many workers' pushes close a round of ``key``."""
        group = self.members.get(key)
        return self.num_workers if group is None else len(group)

    def refusal(self, key: int, sender: int) -> Refusal | None:
        """A push ``sender`` may not make: the key is not its, or it closed its store."""
        group = self.members.get(key)
        if group is not None and sender not in group:
            return Refusal("ValueError", f"key {key} is pushed only by workers "
                                         f"{sorted(id_to_rank(w) for w in group)}, not by {who(sender)}")
        if sender in self.closed:
            return Refusal("PeerLostError", f"{who(sender)} already closed its store")
        return None

    # -- when a round closes -----------------------------------------------------------------
    def round_full(self, key: int, rnd: Round) -> bool:
        """Every worker ``rnd`` needs pushed whole, or is excused by a join."""
        if self.joins.joined and rnd.joinable:
            return all(w in rnd.complete or w in self.joins.joined for w in self.required(key))
        return len(rnd.complete) >= self.needed(key)

    def chunk_full(self, key: int, rnd: Round, pend: list) -> bool:
        """Every worker ``rnd`` needs sent this chunk (``pend``: [(worker, frame)]), or is excused by a join."""
        if self.joins.joined and rnd.joinable:
            have = {w for w, _ in pend}
            return all(w in have or w in self.joins.joined for w in self.required(key))
        return len(pend) >= self.needed(key)

    def excused(self, key: int, rnd: Round) -> list[int]:
        """The joined workers ``rnd`` closed without, although it needed them."""
        group = self.members.get(key)
        return [w for w in self.joins.joined if w not in rnd.complete and (group is None or w in group)]

    def doom(self, key: int, rnd: Round) -> Refusal | None:
        """Why ``rnd`` can never complete: a worker it needs closed its store, or joined and
        the round is not one a join may skip (only sums are); None if it still can."""
        group = self.members.get(key)
        gone = sorted(w for w in self.closed if w not in rnd.members and (group is None or w in group))
        if gone:
            return Refusal("PeerLostError", f"the sync round of key {key} can never complete: "
                                            f"{', '.join(who(w) for w in gone)} closed its store without pushing "
                                            "(do all workers run the same number of steps?)")
        joined = [] if rnd.joinable else sorted(w for w in self.joins.joined if w not in rnd.members
                                                and (group is None or w in group))
        if joined:
            return Refusal("CollectiveError", f"{', '.join(who(w) for w in joined)} joined (hvd.join) and will not "
                                              f"push key {key}: while a worker has joined, only sums (allreduce) "
                                              "run, its share zero")
        return None

    def missing(self, key: int, rnd: Round, workers: list[int]) -> tuple[int, ...]:
        """Of ``workers``, those ``rnd`` still waits for (a stall warning names them)."""
        group = self.members.get(key)
        return tuple(w for w in workers if w not in rnd.complete and (group is None or w in group)
                     and not (rnd.joinable and w in self.joins.joined))

    # -- the join ----------------------------------------------------------------------------
    def left_before(self, worker: int) -> tuple[int, list[tuple[int, int]]] | None:
        """The answer ``worker``'s last leave got, if this is that leave again (resent to
        this server's restart)."""
        if worker not in self.joins.joined and worker in self.joins.left:
            return self.joins.left[worker]
        return None

    def last_to_join(self, worker: int) -> int:
        """The worker that joined last (every worker's leave says so), ``worker`` if none."""
        return self.joins.order[-1] if self.joins.order else worker
