"""ps/drain.py: when the I/O thread looks again at connections held back for a full socket
(PS_SEND_LOWAT). A look per millisecond for the whole drain was the old rule: a 1 MiB message
on a 100 Mbit/s link cost 80 wake-ups."""
import pytest

from ps.drain import LATEST, SOONEST, STALLED, DrainClock
from ps.sendqueue import Held

MB = 1 << 20


def held(excess, taken=0):
    """Connections held back, each with what it must send (none given more since)."""
    return {peer: Held(n, taken) for peer, n in excess.items()}


def test_a_first_look_comes_soonest_then_halfway_to_room_by_the_measured_rate():
    clock = DrainClock()
    assert clock.next_look(held({3: MB}), now=10.0) == SOONEST          # no rate yet
    # 12.5 MB/s (100 Mbit/s): 1/80 of the MB went in 1 ms
    left = MB - MB // 80
    wait = clock.next_look(held({3: left}), now=10.001)
    assert wait == pytest.approx(min(0.5 * left / (MB / 80 / 0.001), LATEST))
    assert wait == LATEST                                         # 39 ms away: capped
    # 300 KB to go, then 250 KB 4 ms later (12.5 MB/s): look again in half of 20 ms
    clock = DrainClock()
    clock.next_look(held({3: 300_000}), now=5.0)
    assert clock.next_look(held({3: 250_000}), now=5.004) == pytest.approx(0.010)


def test_a_look_within_half_a_millisecond_keeps_the_plan_and_measures_nothing():
    clock = DrainClock()
    clock.next_look(held({3: MB}), now=1.0)
    planned = clock.next_look(held({3: MB // 2}), now=1.002)            # 250 MB/s: room in 2 ms, look in 1
    assert planned == pytest.approx(0.001)
    # a message arrived 0.3 ms later: the loop looks, with a noisy reading; the plan stands
    assert clock.next_look(held({3: MB // 2 - 10}), now=1.0023) == pytest.approx(0.0007)


def test_a_connection_that_does_not_drain_is_looked_at_again_within_a_few_milliseconds():
    clock = DrainClock()
    clock.next_look(held({5: MB}), now=0.0)
    waits = [clock.next_look(held({5: MB}), now=0.01 * i) for i in range(1, 5)]
    assert waits == pytest.approx([0.002, STALLED, STALLED, STALLED]) and STALLED <= 0.002


def test_the_soonest_connection_sets_the_look_and_one_that_got_room_is_forgotten():
    clock = DrainClock()
    clock.next_look(held({1: MB, 2: MB}), now=0.0)
    # 1 drains fast (room in ~2 ms), 2 slowly (room in ~1 s)
    wait = clock.next_look(held({1: MB // 2, 2: MB - 1000}), now=0.002)
    assert wait == pytest.approx(0.001)
    assert clock.next_look(held({2: MB - 2000}), now=0.004) == LATEST   # 1 had room: only 2 left
    # 1 held back again: a first look, not a rate from its old readings
    assert clock.next_look(held({1: MB, 2: MB - 3000}), now=0.006) == SOONEST


def test_nothing_held_back_asks_for_the_finest_period_only_as_a_default():
    assert DrainClock().next_look({}, now=0.0) == SOONEST


def test_a_look_is_due_when_planned_or_at_once_for_a_connection_held_back_since():
    clock = DrainClock()
    assert clock.due_in(held({4: MB}), now=0.0) == 0.0                  # never looked at
    clock.next_look(held({4: 300_000}), now=0.0)
    clock.next_look(held({4: 250_000}), now=0.004)                      # plan: 10 ms later
    assert clock.due_in(held({4: 240_000}), now=0.008) == pytest.approx(0.006)
    assert clock.due_in(held({4: 200_000}), now=0.015) == 0.0
    assert clock.due_in(held({4: 240_000, 6: MB}), now=0.008) == 0.0   # 6 is new: look now


def test_a_connection_given_more_since_the_last_look_starts_afresh():
    """Room came between two looks (a credit's take sent it more), so the old reading, from
    before those bytes, says nothing of the rate: a first look, not a 20 ms guess."""
    clock = DrainClock()
    clock.next_look(held({3: MB}), now=0.0)
    clock.next_look(held({3: MB - 10_000}), now=0.010)            # 1 MB/s: a long wait
    assert clock.due_in(held({3: MB // 2}, taken=MB), now=0.012) == 0.0
    assert clock.next_look(held({3: MB // 2}, taken=MB), now=0.012) == SOONEST
