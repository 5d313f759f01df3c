"""The job's barriers, as the scheduler counts them: who has arrived at each group's open
barrier, and how many each node has passed.

The count of passed barriers is what lets a restarted node re-run its start (and a worker
its script): the barriers its dead self passed are answered at once, since the others
passed them long ago. A barrier that can never complete (a member closed its store
without arriving) is answered with an error rather than left to hang.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .membership import Barrier, Replay
from .message import Command, Role

# the scheduler's own lines, under its name as before they moved here (operators grep for it)
logger = logging.getLogger("ps.scheduler")

GROUPS = {"all": (Role.SERVER, Role.WORKER), "workers": (Role.WORKER,), "servers": (Role.SERVER,)}

Send = Callable[[int, Command, Any], None]


class Barriers:
    """Open barriers by group (under the scheduler's lock)."""

    def __init__(self, clock: Callable[[], float], stall_warning: float, members: Callable[[str], list[int]],
                 closed: set[int], describe: Callable[[int], str], send: Send):
        """``members(group)``: the node ids a group's barrier waits for; ``closed``: the
        workers that closed their store (the scheduler's set, read at each check);
        ``describe(id)`` names a node in messages; ``send(id, cmd, body)`` tells it."""
        self.clock = clock
        self.stall_warning = stall_warning
        self._members = members
        self._closed = closed
        self._describe = describe
        self._send = send
        self._open: dict[str, Barrier] = {}
        self._passed: dict[int, dict[str, int]] = {}  # node id -> group -> barriers it passed
        self._replays: dict[int, Replay] = {}       # restarted nodes still replaying barriers
        self._estimated: dict[int, list[str]] = {}  # died with the old scheduler: its groups (estimate)

    def arrive(self, node_id: int, group: str) -> None:
        replay = self._replays.get(node_id)
        if replay is not None and replay.done.get(group, 0) < replay.passed.get(group, 0):
            replay.done[group] = replay.done.get(group, 0) + 1
            self._send(node_id, Command.BARRIER, {"group": group, "error": None})
            return
        barrier = self._open.get(group)
        if barrier is None:
            barrier = self._open[group] = Barrier(self.clock(), set())
        barrier.arrived.add(node_id)
        self.check(group)

    def check(self, group: str) -> None:
        """Release ``group``'s barrier if every member arrived, or fail it if one never will."""
        barrier = self._open.get(group)
        if barrier is None:
            return
        arrived = barrier.arrived
        members = self._members(group)
        gone = [i for i in members if i in self._closed and i not in arrived]
        if gone:
            error = (f"barrier '{group}' can never complete: "
                     f"{', '.join(self._describe(i) for i in gone)} already closed its store")
        elif arrived >= set(members):
            error = None
        else:
            return
        for node_id in arrived:
            if barrier.warned and error is None:      # it named this barrier to them: no longer
                self._send(node_id, Command.STALL, {"text": f"scheduler: barrier '{group}' went on", "over": True})
            self._send(node_id, Command.BARRIER, {"group": group, "error": error})
            if error is None:
                passed = self._passed.setdefault(node_id, {})
                passed[group] = passed.get(group, 0) + 1
        del self._open[group]
        if barrier.warned and error is None:
            logger.warning("scheduler: the stalled barrier '%s' went on after %.0fs", group,
                           self.clock() - barrier.since)

    def forget(self, group: str) -> None:
        """Drop ``group``'s open barrier unanswered: its waiters were told why they stop
        waiting (a deadlock verdict), and arrive again next time."""
        self._open.pop(group, None)

    def check_all(self) -> None:
        for group in list(self._open):
            self.check(group)

    def warn_stalled(self, now: float) -> None:
        """PS_STALL_WARNING: name, once, whom a barrier has waited for too long, here and to
        the nodes that wait in it."""
        after = self.stall_warning
        for group, barrier in self._open.items():
            if barrier.warned or not after or now - barrier.since < after:
                continue
            barrier.warned = True
            missing = [i for i in self._members(group) if i not in barrier.arrived]
            text = (f"barrier '{group}' has waited {now - barrier.since:.0f}s for "
                    f"{', '.join(self._describe(i) for i in missing)}; "
                    f"{len(barrier.arrived)} of {len(missing) + len(barrier.arrived)} arrived "
                    f"(PS_STALL_WARNING={after:g}s)")
            logger.warning("scheduler: %s", text)
            for node_id in barrier.arrived:
                self._send(node_id, Command.STALL, {"text": f"scheduler: {text}"})

    def stalled(self, now: float) -> list[tuple[str, list[int], list[int], float]]:
        """The barriers warned about (PS_STALL_WARNING) and still open: (group, the ids it
        waits for, the ids that arrived, seconds open), for the dashboard."""
        return [(group, [i for i in self._members(group) if i not in b.arrived], sorted(b.arrived), now - b.since)
                for group, b in self._open.items() if b.warned]

    def died(self, node_id: int) -> None:
        """A node died: its restart asks again (answered at once if its dead self passed the
        barrier); completed on the dead arrival, the answer would reach a restart not yet waiting."""
        for barrier in self._open.values():
            barrier.arrived.discard(node_id)

    def rejoin(self, node_id: int, passed: dict[str, int], waiting: list[str]) -> None:
        """A live node reported to a restarted scheduler: the barriers it passed, the ones
        it waits in. One it waits in that another member already passed was released by the
        dead scheduler (the release was lost with it): answered at once."""
        self._passed[node_id] = {g: n for g, n in passed.items() if g in GROUPS}
        for group in waiting:
            if group not in GROUPS:
                continue
            mine = self._passed[node_id].get(group, 0)
            ahead = [p.get(group, 0) for i, p in self._passed.items() if i in self._members(group)]
            if max(ahead, default=0) > mine:
                self._send(node_id, Command.BARRIER, {"group": group, "error": None})
                self._passed[node_id][group] = mine + 1
            else:
                self.arrive(node_id, group)

    def estimate(self, node_id: int, groups: list[str], unknown: set[int]) -> None:
        """A node that died with the old scheduler: it passed what the members that reported
        passed (the fewest: it cannot have passed a barrier one of them still waits in), so
        its restart is answered those at once. Estimated again when its restart comes
        (``replay``): a member that had not reported yet when it was found dead (the only
        other worker, say) has by then, and without its count the restart's first barrier
        would wait for a member that is long past it."""
        self._estimated[node_id] = groups
        self._passed[node_id] = self._estimate(groups, unknown)

    def _estimate(self, groups: list[str], unknown: set[int]) -> dict[str, int]:
        passed = {}
        for group in groups:
            counts = [p.get(group, 0) for i, p in self._passed.items()
                      if i in self._members(group) and i not in unknown and i not in self._estimated]
            if counts:
                passed[group] = min(counts)
        return passed

    def replay(self, node_id: int) -> None:
        """``node_id`` restarted: answer at once the barriers its dead self passed."""
        groups = self._estimated.get(node_id)
        if groups is not None:
            self._passed[node_id] = self._estimate(groups, set())
            del self._estimated[node_id]
        self._replays[node_id] = Replay(dict(self._passed.get(node_id, {})), {})
