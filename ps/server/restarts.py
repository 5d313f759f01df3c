"""Restarted workers (PS_MAX_RESTARTS) as one store sees them (:class:`Restarts`).

A restarted worker re-runs its script from the start: until it pushes something new it
*replays* what its dead self did. Its pushes carry their count (``Entry.seq``), so a push
the store holds already (resent after a server restart too) is answered, not applied twice;
its pulls ask for the value after the round they name; its settings are counted, so one its
dead self made is not made again. A worker that dies leaves its begun pushes in their rounds
for its restart to finish. Owned by the Store and called only by it; the counts are in the
replica (:class:`Replays`, moved by the events this journals), so a server restart judges
replays as its dead self would.
"""
from __future__ import annotations

from typing import Any, Callable

from ..message import Entry, Op
from .events import Event, Replays
from .quorum import who
from .rounds import DEAD, KeyState, Reply, StoreError, Waiter, answer
from .updaters import Optimizers
from .values import Values


class Restarts:
    def __init__(self, keys: dict[int, KeyState], values: Values, opts: Optimizers,
                 record: Callable[[Event], None]):
        self.replays = Replays()
        self._keys, self._sums, self._opts, self._record = keys, values, opts, record

    def apply(self, ev: Event) -> None:
        """A snapshot's "workers" event (a restored store)."""
        self.replays = Replays.from_info(ev.info)

    def _event(self, event: Event) -> None:
        self.replays.apply(event)
        self._record(event)

    # -- a worker dies, its restart catches up -----------------------------------------------
    def died(self, worker: int) -> None:
        """A worker died and its restart is awaited: the pushes it had begun stay (their
        chunks may be summed already) and its restart sends only the rest (``Round.skip``);
        until it pushes something new, it replays what its dead self did."""
        self._event(Event("died", 0, 0, worker))
        for ks in self._keys.values():
            for key in [k for k in ks.partial if k[0] == worker]:   # async: half-received pushes
                del ks.partial[key]
            for rnd in ks.rounds:
                rnd.pulling.pop(worker, None)       # its restart gets at the close what its dead self was sent
                rnd.streamed.pop(worker, None)
                if worker in rnd.members and worker not in rnd.complete:
                    rnd.members[worker] = DEAD
                    rnd.skip[worker] = rnd.received.get(worker, 0)

    def caught_up(self, worker: int) -> None:
        """It pushed something new: what it sends from now on is no replay."""
        if worker in self.replays.replaying:
            self._event(Event("caught_up", 0, 0, worker))

    def pushed(self, worker: int, sync: bool) -> dict[int, int]:
        """Per key, the pushes of ``worker`` the store holds whole: where a restart resumes."""
        if sync:
            return {k: ks.closed + _complete_open(ks, worker) for k, ks in self._keys.items()}
        return {k: ks.applied.get(worker, 0) for k, ks in self._keys.items()}

    # -- pushes and pulls again --------------------------------------------------------------
    def holds(self, ks: KeyState, sender: int, seq: int, sync: bool) -> bool:
        """Whether push number ``seq`` of ``sender`` is here already: resent after a server
        restart, or replayed by a restarted worker (its dead self pushed it, whole, into a
        closed or open round)."""
        if not sync:
            return seq <= ks.applied.get(sender, 0)
        if seq > ks.closed + len(ks.rounds):      # the usual case: a new push (no loop on the hot path)
            return False
        return seq <= ks.closed + _complete_open(ks, sender)

    def answer_again(self, ks: KeyState, sender: int, entry: Entry, sync: bool) -> list[Reply]:
        """Answer such a push once, at its last chunk (chunks of one push arrive in order),
        with the value after its round: now if closed, else when it closes."""
        if entry.offset + entry.length < entry.total:
            return []
        if entry.op & Op.PULL and sender in self.replays.replaying and sync:
            self._check(ks, sender, entry.seq)
        index = entry.seq - ks.closed - 1
        if sync and 0 <= index < len(ks.rounds):
            ks.rounds[index].pulls.append(Waiter(sender, entry))
            return []
        kept = ks.kept(entry.seq) if sync else None
        if kept is not None:
            # the next round has changed the value since (its dead self pushed into it, or
            # began to): answer with the value after this push's own round
            return answer(kept, Waiter(sender, entry), self._sums.chunk_bytes)
        replies = self._sums.answer(ks, Waiter(sender, entry))
        if sync and ks.rounds and ks.rounds[0].started:
            # the open round writes its next chunks into the value in place: copy-on-write
            # runs only at a round's first chunk (streamed chunks are final for their round,
            # so a check per chunk would copy the value at every chunk); a whole slice lent
            # now would change under the transport, so this rare reply is a copy
            replies = [r._replace(data=r.data.copy()) if r.data is not None else r for r in replies]
        return replies

    def replayed_pull(self, ks: KeyState, waiter: Waiter, sync: bool) -> list[Reply] | None:
        """A restarted worker's pull asks for the value after round ``seq`` (its pushes so
        far), whatever its dead self left in the open rounds (waiting for its membership
        there would hang a restart that pulls before it pushes again: the round needs the
        rest of its push). A round still open: when it closes; the last closed: now; the one
        before: its kept value; older: the latest weights, and a sum is refused
        (:meth:`_check`). None: not a replay, answer as for anyone."""
        sender, entry = waiter.worker, waiter.entry
        if not sync or sender not in self.replays.replaying:
            return None
        index = entry.seq - ks.closed - 1
        if index >= 0:
            if index < len(ks.rounds):
                ks.rounds[index].pulls.append(waiter)
                return []
            return None                     # a round not begun: as anyone's pull
        self._check(ks, sender, entry.seq)
        kept = ks.kept(entry.seq)
        return self._sums.answer(ks, waiter) if kept is None else answer(kept, waiter, self._sums.chunk_bytes)

    def _check(self, ks: KeyState, sender: int, seq: int) -> None:
        """A restarted worker replaying its script asks for the value after round ``seq`` (a
        pull: after the rounds it has pushed so far) of a sync key. With an optimizer here
        that is the weights, and the latest are the right answer; without one the value is
        a round's sum (the weights live on the workers: MXNet's update_on_kvstore=False, a
        Horovod-style job, a numpy KVStore without set_optimizer), and the sums of the rounds
        its dead self finished are gone: refuse, instead of handing it another round's sum
        to train on."""
        if not ks.closed or self._opts.updater(ks.key) is not None:
            return
        if seq >= ks.closed or ks.kept(seq) is not None:
            return                      # this round's own sum is here, or still to come (an open round)
        raise StoreError("CollectiveError", (
            f"{who(sender)} was restarted and re-runs its script, but key {ks.key} has no optimizer on the "
            f"servers: its value is the sum of round {ks.closed}, not weights, and the sums of the rounds its dead "
            "self finished are gone (the weights live on the workers: update_on_kvstore=False, or a "
            "Horovod-style job). A worker of such a job cannot be restarted into it: start the job again"))

    # -- settings (server commands) again ----------------------------------------------------
    def setting_resent(self, worker: int, cid: Any) -> bool:
        """The worker sent this setting (command id ``cid``) again: this server's dead self
        counted it, and died before its answer left (the count came with the replica).
        A worker's commands are numbered from 1 in each incarnation, one at a time."""
        return isinstance(cid, int) and cid <= self.replays.last.get(worker, 0)

    def setting_made_before(self, worker: int, cmd: str, cid: Any = None) -> bool:
        """(Counts it.) A restarted worker's n-th ``cmd`` while it replays its script was made
        by its dead self if that one made n or more. Not "the store has it": a worker killed
        between kv.init and set_optimizer, or before a step's set_params, left them unmade."""
        if worker not in self.replays.replaying:
            return False
        self._event(Event("setting", 0, 0, [worker, cmd, "replayed", cid]))
        return self.replays.replayed[(worker, cmd)] <= self.replays.applied[(worker, cmd)]

    def setting_applied(self, worker: int, cmd: str, cid: Any = None) -> None:
        self._event(Event("setting", 0, 0, [worker, cmd, "applied", cid]))


def _complete_open(ks: KeyState, worker: int) -> int:
    """How many of the key's leading open rounds hold a whole push of ``worker``."""
    n = 0
    for rnd in ks.rounds:
        if worker not in rnd.complete:
            break
        n += 1
    return n
