"""Keys only some workers push (Horovod's process sets, ``Store.set_members``): their rounds
close when those workers pushed, other workers are refused, stalls and closed workers count
members only, and a backup's copy and a restored store keep the members. Keys made by their
first push (``Op.CREATE``), and workers that joined (Horovod's join, ``Store.join``)."""
import numpy as np
import pytest

from ps.frames import dtype_code
from ps.message import Entry, Op
from ps.server.replica import Mirror, decode_events, encode_events, restore, snapshot
from ps.server.store import Store

W0, W1, W2 = 9, 11, 13          # workers 0, 1, 2
F32 = dtype_code(np.float32)


def entry(ts, op, key, seq=0):
    return Entry(ts, int(op), key, 0, 4, 4, F32, None, 0, seq)


def init(store, key, sender=W0):
    (reply,) = store.handle(sender, entry(1, Op.INIT, key), np.zeros(4, np.float32))
    assert reply.entry[7] is None


def push(store, w, ts, key, value, seq=0):
    return store.handle(w, entry(ts, Op.PUSH | Op.PULL, key, seq), np.full(4, value, np.float32))


def test_a_members_key_closes_its_round_when_its_members_pushed():
    s = Store(3)
    s.set_members([5], [W0, W2])
    init(s, 5, W2)
    init(s, 6)                                          # an ordinary key: every worker
    assert push(s, W0, 10, 5, 1.0, 1) == []
    replies = push(s, W2, 11, 5, 2.0, 1)
    assert sorted(r.dest for r in replies) == [W0, W2]
    assert all(np.array_equal(r.data, np.full(4, 3.0)) for r in replies)
    assert push(s, W0, 12, 6, 1.0, 1) == [] and push(s, W2, 13, 6, 1.0, 1) == []   # still waits for worker 1
    assert len(push(s, W1, 14, 6, 1.0, 1)) == 3


def test_a_worker_outside_the_members_is_refused_by_name():
    s = Store(3)
    s.set_members([5], [W0, W2])
    init(s, 5)
    (err,) = push(s, W1, 10, 5, 1.0, 1)
    assert err.entry[7][0] == "ValueError" and "[0, 2]" in err.entry[7][1] and "worker 1" in err.entry[7][1]
    assert s.keys[5].rounds == []


def test_stalls_and_closed_workers_count_members_only():
    now = [0.0]
    s = Store(3, clock=lambda: now[0])
    s.set_members([5], [W0, W1])
    init(s, 5)
    assert push(s, W0, 10, 5, 1.0, 1) == []
    now[0] = 100.0
    (stall,) = s.stalls(1.0, [W0, W1, W2])
    assert stall.missing == (W1,)
    assert s.worker_closed(W2) == []                    # not a member: the round can still close
    (err,) = s.worker_closed(W1)
    assert err.dest == W0 and err.entry[7][0] == "PeerLostError"


def test_members_are_set_before_the_key_is_pushed_and_not_changed_after():
    s = Store(2)
    s.set_members([5], [W0])
    s.set_members([5], [W0])                            # idempotent (a restarted worker repeats it)
    init(s, 5)
    assert len(push(s, W0, 10, 5, 1.0, 1)) == 1
    for bad, text in (([W1], "pushed already"), ([], "non-empty"), ([W0, 99], "non-empty")):
        with pytest.raises(RuntimeError, match=text):
            s.set_members([5], bad)


def test_the_backup_copy_and_a_restored_store_keep_the_members():
    s = Store(3)
    s.journal = []
    s.set_members([5], [W0, W2])
    init(s, 5)
    mirror = Mirror(8)
    body, frames = encode_events(s.journal)
    mirror.apply(decode_events(body, [memoryview(f) for f in frames]))
    assert mirror.members == {5: frozenset({W0, W2})}
    for events in (snapshot(s), mirror.snapshot()):
        again = Store(3)
        restore(again, events)
        assert again.members == {5: frozenset({W0, W2})}
        assert push(again, W0, 10, 5, 1.0, 1) == []
        assert len(push(again, W2, 11, 5, 1.0, 1)) == 2


def joinable(store, w, ts, key, value, seq):
    e = Entry(ts, int(Op.PUSH | Op.PULL | Op.CREATE | Op.JOINABLE), key, 0, 4, 4, F32, None, 0, seq)
    return store.handle(w, e, np.full(4, value, np.float32))


def created(store, w, ts, key, value, seq):
    e = Entry(ts, int(Op.PUSH | Op.PULL | Op.CREATE), key, 0, 4, 4, F32, None, 0, seq)
    return store.handle(w, e, np.full(4, value, np.float32))


def test_a_declared_key_is_made_by_its_first_push():
    s = Store(2)
    s.journal = []
    assert created(s, W1, 10, 7, 2.0, 1) == []              # made (zeros), and its round opened
    assert s.journal[0].kind == "init" and not s.journal[0].arrays[0].any()
    replies = created(s, W0, 11, 7, 1.0, 1)                  # the key exists: the flag changes nothing
    assert [r.data.tolist() for r in replies] == [[3.0] * 4] * 2


def test_a_joined_worker_is_excused_from_joinable_rounds_and_fails_the_others():
    s = Store(3)
    assert joinable(s, W0, 10, 5, 1.0, 1) == [] and created(s, W0, 11, 6, 1.0, 1) == []
    replies = s.join(W2)                     # worker 2 has no more steps: key 5's round still waits for 1
    assert [(r.dest, r.entry[7][0]) for r in replies] == [(W0, "CollectiveError")]      # key 6 cannot close
    assert "worker 2" in replies[0].entry[7][1] and "joined (hvd.join)" in replies[0].entry[7][1]
    replies = joinable(s, W1, 12, 5, 2.0, 1)
    assert sorted(r.dest for r in replies) == [W0, W1] and replies[0].data.tolist() == [3.0] * 4
    for seq in (2, 3):                       # two more rounds without worker 2
        joinable(s, W0, 20 + seq, 5, 1.0, seq)
        assert len(joinable(s, W1, 30 + seq, 5, 1.0, seq)) == 2
    assert joinable(s, W0, 40, 5, 1.0, 4) == []
    (stall,) = s.stalls(-1.0, [W0, W1, W2])
    assert stall.missing == (W1,)            # the joined worker is not waited for
    s.join(W1)                               # now worker 0's round closes too
    assert s.keys[5].closed == 4
    s.join(W0)
    assert s.leave(W1) == (W0, [(5, 1)])     # the last to join; rounds of key 5 closed without worker 1
    assert s.leave(W0) == (W0, [])
    assert s.leave(W2) == (W0, [(5, 4)])
    assert s.joins.joined == {} and s.joins.order == []
    # back to normal: worker 2 pushes as round 5 after skipping 4, with the others
    assert joinable(s, W0, 50, 5, 1.0, 5) == [] and joinable(s, W1, 51, 5, 1.0, 5) == []
    assert len(joinable(s, W2, 52, 5, 1.0, 5)) == 3


def test_the_join_is_in_the_copy_and_a_restored_store_goes_on_with_it():
    """A server restarted while workers are in join (PS_MAX_RESTARTS): its backup's copy, and
    a snapshot, carry who joined, in what order, and the rounds each key closed without them;
    a leave resent to the restart gets its dead self's answer again."""
    s = Store(3)
    s.journal = []
    mirror = Mirror(8)
    assert joinable(s, W0, 10, 5, 1.0, 1) == [] and joinable(s, W1, 11, 5, 1.0, 1) == []
    s.join(W2)                               # closes round 1 without worker 2
    s.join(W1)
    assert len(joinable(s, W0, 12, 5, 1.0, 2)) == 1     # round 2: only worker 0 still pushes
    body, frames = encode_events(s.journal)
    s.journal.clear()
    mirror.apply(decode_events(body, [memoryview(f) for f in frames]))
    assert mirror.joins.order == [W2, W1] and mirror.keys[5].excused == {W2: 2, W1: 1}
    for events in (snapshot(s), mirror.snapshot()):
        again = Store(3)
        restore(again, decode_events(*encode_events(events)))
        assert list(again.joins.joined) == [W2, W1] and again.keys[5].excused == {W2: 2, W1: 1}
        assert len(joinable(again, W0, 13, 5, 1.0, 3)) == 1     # closes alone, as on the dead server
        again.join(W0)
        assert again.leave(W2) == (W0, [(5, 3)])
        assert again.leave(W2) == (W0, [(5, 3)])    # resent: the same answer, nothing popped twice
    s.join(W0)
    assert s.leave(W1) == (W0, [(5, 1)])
    body, frames = encode_events(s.journal)
    mirror.apply(decode_events(body, [memoryview(f) for f in frames]))
    again = Store(3)
    restore(again, mirror.snapshot())
    assert again.leave(W1) == (W0, [(5, 1)])        # left before the restart: its answer again
    assert W1 not in again.keys[5].excused and again.keys[5].excused == {W2: 2}
