"""PauseWatch: a periodic check holds its judgement right after its own process did not run,
and a deadline it watches is postponed by the pause."""
import logging

from ps._timing import Deadline, PauseWatch
from tests.helpers import Clock


def test_a_late_call_holds_and_so_do_the_calls_while_the_io_thread_reads_what_waited(caplog):
    clock = Clock()
    watch = PauseWatch(0.5, lambda: "server 1", clock=clock)
    for _ in range(3):                      # on time, or a little late: judge
        clock.now += 0.5
        assert not watch.hold()
    clock.now += 1.4
    assert not watch.hold()                 # 0.9 s late: within the slack
    with caplog.at_level(logging.WARNING, logger="ps._timing"):
        clock.now += 7.0                    # stopped for 7 s
        assert watch.hold()
    assert "server 1: its periodic checks ran 6.5s late" in caplog.text     # beyond its 0.5 s period
    clock.now += 0.1
    assert watch.hold()                     # still settling
    clock.now += 0.5
    assert not watch.hold()


def test_a_check_that_is_always_late_still_judges_every_other_time():
    clock = Clock()
    watch = PauseWatch(0.2, clock=clock)
    held = []
    for _ in range(6):
        clock.now += 2.0
        held.append(watch.hold())
    assert held == [True, False, True, False, True, False]


def test_a_pause_right_after_a_starved_moment_still_holds_and_postpones_the_deadline():
    """Seen in a whole suite's run: a wait's turn came 1.6 s late (the CPU starved) and held;
    the process was then stopped for 6 s before its next turn. That turn is the second late
    one in a row, but far later than the first: it holds, and the deadline moves by the pause
    (before, it judged, and the pull failed on the reply waiting in its socket)."""
    clock = Clock()
    deadline = Deadline(4.0, clock=clock)
    watch = PauseWatch(0.5, clock=clock)
    clock.now += 2.1                        # starved: 1.6 s late
    assert watch.hold(deadline)
    assert abs(deadline.remaining() - (4.0 - 2.1 + 1.6)) < 1e-9
    clock.now += 6.5                        # stopped: 6.0 s late, more than 1.6 + the slack
    assert watch.hold(deadline)
    assert not deadline.expired and abs(deadline.remaining() - (3.5 - 6.5 + 6.0)) < 1e-9
    clock.now += 0.5
    assert not watch.hold(deadline)         # on time again: judges


def test_the_first_period_starts_when_the_watch_is_made():
    clock = Clock()
    watch = PauseWatch(0.5, clock=clock)
    clock.now += 5.0                        # a wait that began, then the process was stopped
    assert watch.hold()


def test_one_line_per_pause_per_process_whatever_the_clocks(caplog):
    clock = Clock()
    watches = [PauseWatch(0.5, lambda: "worker 1", clock=clock) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="ps._timing"):
        clock.now += 5.0
        assert all(w.hold() for w in watches)           # both threads hold, one says so
        assert caplog.text.count("ran 4.5s late") == 1
        other = PauseWatch(0.5, lambda: "worker 1", clock=lambda: clock.now - 1000.0)
        clock.now += 5.0                                # a clock far behind the one that logged
        assert other.hold()
        assert caplog.text.count("periodic checks ran") == 2


def test_a_deadline_is_postponed_by_each_pause_once_and_never_by_an_on_time_call():
    clock = Clock()
    deadline = Deadline(3.0, clock=clock)
    watch = PauseWatch(0.5, clock=clock)
    clock.now += 0.5
    assert not watch.hold(deadline)
    assert deadline.remaining() == 2.5      # on time: nothing postponed
    clock.now += 6.5                        # stopped for 6 s: 6.0 s beyond the period
    assert watch.hold(deadline)
    assert not deadline.expired and deadline.remaining() == 2.0
    clock.now += 0.1
    assert watch.hold(deadline)             # settling: the same pause, not counted again
    assert abs(deadline.remaining() - 1.9) < 1e-9
    clock.now += 2.0
    assert not watch.hold(deadline) and deadline.expired
    unbounded = Deadline(None, clock=clock)
    unbounded.postpone(5.0)
    assert unbounded.remaining() is None


def test_the_waits_sharing_a_deadline_notice_a_pause_whichever_of_them_was_waiting():
    """A handle's requests wait one after another on one deadline: a pause during the first
    one's wait is noticed by the second's first turn, even if the first never saw it."""
    clock = Clock()
    deadline = Deadline(4.0, clock=clock)
    assert not deadline.paused()            # the first wait starts the watch
    clock.now += 0.5
    assert not deadline.paused()
    clock.now += 6.5                        # stopped; the first request's reply came meanwhile
    assert deadline.paused()                # the second request's first turn
    assert not deadline.expired and abs(deadline.remaining() - 3.0) < 1e-9
