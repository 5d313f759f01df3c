"""BufferGuard: the copy-on-write rule for values that zero-copy replies may still read."""
import weakref

import numpy as np

from ps.server.bufguard import PRUNE_AT, ZERO_COPY_MIN, BufferGuard


class Tracker:
    """Stands in for zmq's MessageTracker: ``done`` once the transport let go of the frames."""

    def __init__(self, done=False):
        self.done = done

    def wait(self, timeout):
        if not self.done:
            raise RuntimeError("NotDone")


def test_a_lent_value_is_copied_until_its_replies_are_handed_over():
    g = BufferGuard()
    value = np.arange(4.0)
    g.lend(value)
    copy = g.writable(value)
    assert copy is not value and np.array_equal(copy, value)
    g.lend(value)
    g.handed_over()
    assert g.writable(value) is value


def test_a_value_whose_reply_still_waits_in_the_send_queue_stays_lent():
    """PS_SEND_WINDOW: a server's reply may wait in its queue after the others left."""
    g = BufferGuard()
    waiting, sent = np.arange(8.0), np.arange(8.0)
    g.lend(waiting)
    g.lend(sent)
    g.handed_over(pending=[waiting[4:]])
    assert g.writable(sent) is sent
    assert g.writable(waiting) is not waiting
    g.lend(waiting)
    g.handed_over(pending=[])
    assert g.writable(waiting) is waiting


def test_a_value_the_transport_still_reads_is_copied_and_freed_once_sent():
    g = BufferGuard()
    value = np.zeros(ZERO_COPY_MIN // 8 * 2)          # float64: two zero-copy chunks' worth
    frames = [value[: value.size // 2], value[value.size // 2:]]
    on_sent = g.on_sent(frames)
    tracker = Tracker()
    on_sent(tracker)
    assert g.busy(value, wait=0)
    assert g.writable(value) is not value
    tracker.done = True
    assert not g.busy(value)
    assert g.writable(value) is value


def test_small_frames_are_copied_by_the_transport_and_not_tracked():
    g = BufferGuard()
    assert g.on_sent([np.zeros(16, np.float32)]) is None


def test_finished_trackers_are_pruned_so_old_values_are_not_pinned():
    g = BufferGuard()
    refs = []
    for _ in range(PRUNE_AT + 1):
        v = np.zeros(ZERO_COPY_MIN // 8)
        g.on_sent([v])(Tracker(done=True))
        refs.append(weakref.ref(v))
        del v
    live = np.zeros(ZERO_COPY_MIN // 8)
    g.on_sent([live])(Tracker())             # past PRUNE_AT: finished entries go
    assert [r for r in refs if r() is not None] == []
    assert g.busy(live, wait=0)
