"""ps/drain.py: when the I/O thread looks again at connections held back for a full socket
(PS_SEND_LOWAT). A look per millisecond for the whole drain was the old rule: a 1 MiB message
on a 100 Mbit/s link cost 80 wake-ups."""
import pytest

from ps.drain import LATEST, SOONEST, STALLED, DrainClock
from ps.sendqueue import Held
from tests.helpers import Clock

MB = 1 << 20


def held(excess, taken=0):
    """Connections held back, each with what it must send (none given more since)."""
    return {peer: Held(n, taken) for peer, n in excess.items()}


def looks(clock, at, readings, taken=0):
    """next_look at each time with that reading of connection 3."""
    t = Clock(0.0)
    clock.clock = t
    waits = []
    for now, left in zip(at, readings):
        t.now = now
        waits.append(clock.next_look(held({3: left}, taken)))
    return waits


def test_a_first_look_comes_soonest_then_halfway_to_room_by_the_measured_rate():
    # 12.5 MB/s (100 Mbit/s): 1/80 of the MB went in 1 ms; room is 79 ms away: capped
    assert looks(DrainClock(), [10.0, 10.001], [MB, MB - MB // 80]) == [SOONEST, LATEST]
    # 300 KB to go, then 250 KB 4 ms later (12.5 MB/s): room in 20 ms, look in 10
    assert looks(DrainClock(), [5.0, 5.004], [300_000, 250_000]) == pytest.approx([SOONEST, 0.010])


def test_a_look_before_its_plan_keeps_it_and_measures_nothing():
    clock = DrainClock()
    looks(clock, [1.0, 1.004], [300_000, 250_000])                # plan: 10 ms after 1.004
    # another connection's look 0.3 ms later: a burst of the kernel's would read as 10x the
    # rate; this connection's plan stands, measured from its own look
    clock.clock.now = 1.0043
    assert clock.next_look(held({3: 200_000})) == pytest.approx(0.0097)
    clock.clock.now = 1.014                                       # due: measured over 10 ms
    assert clock.next_look(held({3: 125_000})) == pytest.approx(0.5 * 125_000 / (125_000 / 0.010))


def test_a_connection_that_does_not_drain_is_looked_at_again_every_stalled_period():
    waits = looks(DrainClock(), [0.0, 0.01, 0.02, 0.03], [MB, MB, MB, MB])
    assert waits == pytest.approx([SOONEST, STALLED, STALLED, STALLED])


def test_the_soonest_connection_sets_the_look_and_one_that_got_room_is_forgotten():
    t = Clock(0.0)
    clock = DrainClock(t)
    clock.next_look(held({1: MB, 2: MB}))
    t.now = 0.002              # 1 drains fast (room in ~2 ms), 2 slowly (room in ~1 s)
    assert clock.next_look(held({1: MB // 2, 2: MB - 1000})) == pytest.approx(0.001)
    t.now = 0.004              # 1 had room: only 2 is left, its plan (20 ms after 0.002) stands
    assert clock.next_look(held({2: MB - 2000})) == pytest.approx(0.018)
    t.now = 0.006              # 1 held back again: a first look, not a rate from old readings
    assert clock.next_look(held({1: MB, 2: MB - 3000})) == SOONEST


def test_a_look_is_due_when_planned_or_at_once_for_a_connection_held_back_or_given_more_since():
    t = Clock(0.0)
    clock = DrainClock(t)
    assert clock.due_in(held({4: MB})) == 0.0                     # never looked at
    clock.next_look(held({4: 300_000}))
    t.now = 0.004
    clock.next_look(held({4: 250_000}))                           # plan: 10 ms later
    t.now = 0.008
    assert clock.due_in(held({4: 240_000})) == pytest.approx(0.006)
    assert clock.due_in(held({4: 240_000, 6: MB})) == 0.0        # 6 is new: look now
    assert clock.due_in(held({4: 240_000}, taken=1)) == 0.0      # 4 was given more: afresh
    assert clock.next_look(held({4: 240_000}, taken=1)) == SOONEST
    t.now = 0.015
    assert clock.due_in(held({4: 200_000}, taken=1)) == 0.0
