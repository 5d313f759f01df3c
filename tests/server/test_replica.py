"""A backup's copy (ps/server/replica.py) replays the primary store's changes bit for bit, on every
path a round can take, and a store restored from it goes on exactly like the original."""
import numpy as np
import pytest

from ps import optim
from ps.errors import ProtocolError
from ps.frames import Rows, dtype_code
from ps.message import Entry, Op
from ps.server.events import Event
from ps.server.replica import Mirror, decode_events, encode_events, restore, snapshot
from ps.server.store import Store

W = (9, 11, 13)
F32, F16 = dtype_code(np.float32), dtype_code(np.float16)
N = 5000                       # several 4 KB chunks per push (chunk_bytes below)


def grads(rnd: int, worker: int, n: int = N, dtype=np.float32) -> np.ndarray:
    x = np.arange(n, dtype=np.float64)
    return (np.sin(0.01 * x + 0.7 * rnd + 1.9 * worker) * 0.1).astype(dtype)


def push(store: Store, key: int, worker: int, ts: int, value: np.ndarray, seq: int, chunk: int = 1000) -> None:
    code = dtype_code(value.dtype)
    for off in range(0, value.size, chunk):
        part = value[off:off + chunk]
        store.handle(worker, Entry(ts, Op.PUSH, key, off, part.size, value.size, code, None, 0, seq), part)


def replayed(store: Store, mirror: Mirror) -> None:
    """Ship the store's journal through the wire format into the mirror."""
    body, frames = encode_events(store.journal)
    store.journal.clear()
    mirror.apply(decode_events(body, [memoryview(f) for f in frames]))


def make(sync=True, opt=None, multi=False, dtype=np.float32):
    store = Store(len(W), sync=sync, chunk_bytes=4096)
    store.journal = []
    mirror = Mirror(8)
    if opt is not None:
        store.set_updater(optim.Updater(opt), multi)
        store.journal.append(Event("opt", 0, 0, [opt.to_spec(), multi]))     # as the server records it
    value = np.linspace(-1, 1, N).astype(dtype)
    store.handle(W[0], Entry(1, Op.INIT, 3, 0, N, N, dtype_code(dtype)), value)
    replayed(store, mirror)
    return store, mirror


OPTIMIZERS = {
    "none": None,
    "sgd-momentum (elementwise, chunk by chunk)": optim.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3),
    "adam (elementwise)": optim.Adam(learning_rate=0.01, wd=1e-3),
    "lamb (whole key at once)": optim.LAMB(learning_rate=0.01),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_sync_rounds_replay_bit_for_bit(name):
    store, mirror = make(opt=OPTIMIZERS[name])
    for rnd in range(4):
        for i, w in enumerate(W):
            push(store, 3, w, 100 * rnd + i, grads(rnd, w), rnd + 1)
        replayed(store, mirror)
        assert mirror.keys[3].closed == rnd + 1
        np.testing.assert_array_equal(mirror.keys[3].value, store.keys[3].value)
    assert not np.array_equal(store.keys[3].value, np.linspace(-1, 1, N).astype(np.float32))


def test_a_half_done_round_is_not_in_the_copy_until_it_closes():
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    before = mirror.keys[3].value.copy()
    for w in W[:2]:
        push(store, 3, w, 7, grads(0, w), 1)
    for off in (0, 1000):                          # the last worker's first two chunks only
        store.handle(W[2], Entry(7, Op.PUSH, 3, off, 1000, N, F32, None, 0, 1), grads(0, W[2])[off:off + 1000])
    assert store.half_applied() == [3]             # two chunks applied on the primary already
    replayed(store, mirror)
    np.testing.assert_array_equal(mirror.keys[3].value, before)      # ... but not in the copy
    for off in range(2000, N, 1000):
        store.handle(W[2], Entry(7, Op.PUSH, 3, off, 1000, N, F32, None, 0, 1), grads(0, W[2])[off:off + 1000])
    replayed(store, mirror)
    np.testing.assert_array_equal(mirror.keys[3].value, store.keys[3].value)
    assert store.half_applied() == []


def test_row_sparse_and_mixed_rounds_replay():
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9, lazy_update=True))
    row_len = 50
    for rnd in range(3):
        for i, w in enumerate(W):
            if rnd == 2 and i == 0:                   # one dense push: the round is summed dense
                push(store, 3, w, 10 * rnd + i, grads(rnd, w), rnd + 1)
                continue
            ids = np.unique(np.random.default_rng(rnd * 7 + i).integers(0, N // row_len, 12)).astype(np.uint32)
            vals = grads(rnd, w, ids.size * row_len)
            store.handle(w, Entry(10 * rnd + i, Op.PUSH | Op.ROWS, 3, 0, ids.size, ids.size, F32, None, row_len,
                                  rnd + 1), Rows(ids, vals))
        replayed(store, mirror)
        np.testing.assert_array_equal(mirror.keys[3].value, store.keys[3].value)


def test_async_pushes_replay_and_fp16_multi_precision():
    store, mirror = make(sync=False, opt=optim.Adam(learning_rate=0.01, multi_precision=True), multi=True,
                         dtype=np.float16)
    for rnd in range(3):
        for w in W:
            push(store, 3, w, 10 * rnd + w, grads(rnd, w, dtype=np.float16), rnd + 1)
    replayed(store, mirror)
    np.testing.assert_array_equal(mirror.keys[3].value, store.keys[3].value)
    assert mirror.keys[3].applied == {w: 3 for w in W}


@pytest.mark.parametrize("sync", [True, False])
def test_a_store_restored_from_the_copy_goes_on_exactly(sync):
    opt = optim.Adam(learning_rate=0.01, wd=1e-3)
    store, mirror = make(sync=sync, opt=opt)
    for rnd in range(3):
        for i, w in enumerate(W):
            push(store, 3, w, 100 * rnd + i, grads(rnd, w), rnd + 1)
    replayed(store, mirror)
    body, frames = encode_events(mirror.snapshot())
    fresh = Store(len(W), sync=sync, chunk_bytes=4096)
    restore(fresh, decode_events(body, frames))
    # a push resent after the restart that the copy already holds is answered, not applied
    before = fresh.keys[3].value.copy()
    replies = fresh.handle(W[0], Entry(999, Op.PUSH | Op.PULL, 3, 0, N, N, F32, None, 0, 3), grads(2, W[0]))
    assert len(replies) >= 1 and replies[-1].entry.error is None
    np.testing.assert_array_equal(fresh.keys[3].value, before)
    for rnd in range(3, 6):
        for i, w in enumerate(W):
            push(store, 3, w, 100 * rnd + i, grads(rnd, w), rnd + 1)
            push(fresh, 3, w, 100 * rnd + i, grads(rnd, w), rnd + 1)
    np.testing.assert_array_equal(fresh.keys[3].value, store.keys[3].value)


def test_a_snapshot_taken_by_the_primary_equals_the_copy():
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    for i, w in enumerate(W):
        push(store, 3, w, i, grads(0, w), 1)
    replayed(store, mirror)
    other = Mirror(8)
    body, frames = encode_events(snapshot(store))
    other.apply(decode_events(body, frames))
    np.testing.assert_array_equal(other.keys[3].value, mirror.keys[3].value)
    assert other.opts.updaters[0].get_states() == mirror.opts.updaters[0].get_states()


def test_two_namespaces_replay_snapshot_and_restore_each_with_its_optimizer():
    """A second kvstore of an MXNet process (a GAN's Trainer): its key goes through its own
    optimizer on the primary, in the backup's copy, and in a server restored from either."""
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    store.handle(W[0], Entry(2, Op.INIT, 4, 0, N, N, F32), np.linspace(-1, 1, N).astype(np.float32))
    adam = optim.Adam(learning_rate=0.01)
    store.set_updater(optim.Updater(adam), False, ns=1)
    store.record(Event("opt", 1, 0, [adam.to_spec(), False]))      # as the server records it
    store.set_namespace([4], 1)
    for rnd in range(3):
        for i, w in enumerate(W):
            for key in (3, 4):
                push(store, key, w, 100 * rnd + 10 * key + i, grads(rnd, w), rnd + 1)
        replayed(store, mirror)
    np.testing.assert_array_equal(mirror.keys[4].value, store.keys[4].value)
    np.testing.assert_array_equal(mirror.keys[3].value, store.keys[3].value)
    # the same pushes through one optimizer would have given the keys the same values
    assert not np.array_equal(store.keys[3].value, store.keys[4].value)
    restored = Store(len(W), chunk_bytes=4096)
    body, frames = encode_events(mirror.snapshot())
    restore(restored, decode_events(body, frames))
    assert restored.opts.namespace(4) == 1 and restored.opts.namespace(3) == 0
    for rnd in range(3, 5):                       # both go on exactly like the original
        for i, w in enumerate(W):
            for key in (3, 4):
                push(store, key, w, 100 * rnd + 10 * key + i, grads(rnd, w), rnd + 1)
                push(restored, key, w, 100 * rnd + 10 * key + i, grads(rnd, w), rnd + 1)
    for key in (3, 4):
        np.testing.assert_array_equal(restored.keys[key].value, store.keys[key].value)


def test_keys_are_not_moved_between_namespaces_in_the_middle_of_a_round():
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    for w in W[:2]:
        push(store, 3, w, 7, grads(0, w), 1)
    store.handle(W[2], Entry(7, Op.PUSH, 3, 0, 1000, N, F32, None, 0, 1), grads(0, W[2])[:1000])
    assert store.half_applied() == [3]
    with pytest.raises(RuntimeError, match=r"cannot move keys \[3\] to namespace 1 while their sync rounds"):
        store.set_namespace([3], 1)
    assert store.opts.namespace(3) == 0


def test_bad_replica_messages_are_refused():
    body, frames = encode_events(snapshot(make()[0]))
    with pytest.raises(ProtocolError, match="frame size"):
        decode_events(body, [f[:-1] for f in frames])
    with pytest.raises(ProtocolError, match="malformed"):
        decode_events([["key", "3", 0, None, []]], [])
    with pytest.raises(ProtocolError, match="more replica frames"):
        decode_events([], [b"x"])
    with pytest.raises(ProtocolError, match="unknown replica event"):
        Mirror(8).apply(decode_events([["evil", 3, 0, None, []]], []))


# -- a worker that died and restarted (Store.worker_died) ---------------------------------------
def seq_push(store, w, ts, value, seq, offs=None, chunk=1000):
    out = []
    for off in (range(0, value.size, chunk) if offs is None else offs):
        part = value[off:off + chunk]
        out += store.handle(w, Entry(ts, Op.PUSH | Op.PULL, 3, off, part.size, value.size, F32, None, 0, seq), part)
    return out


def test_a_restarted_worker_finishes_the_push_its_dead_self_began():
    plain, store = Store(2, chunk_bytes=4096), Store(2, chunk_bytes=4096)
    for s in (plain, store):
        s.handle(W[0], Entry(1, Op.INIT, 3, 0, N, N, F32), np.zeros(N, np.float32))
        seq_push(s, W[0], 10, grads(0, W[0]), 1)
    seq_push(plain, W[1], 20, grads(0, W[1]), 1)
    seq_push(store, W[1], 20, grads(0, W[1]), 1, offs=(0, 1000))     # two chunks, then it dies
    store.worker_died(W[1])
    assert store.replays.replaying == {W[1]}
    replies = seq_push(store, W[1], 5, grads(0, W[1]), 1)              # its restart sends it all again
    np.testing.assert_array_equal(store.keys[3].value, plain.keys[3].value)
    assert store.keys[3].closed == 1 and not store.replays.replaying
    assert {r.dest for r in replies} == {W[0], W[1]}                   # the round closed: both answered


def test_a_replayed_push_is_answered_with_the_value_after_its_round_and_not_applied():
    """The weights (an optimizer runs here): a replay is answered with the latest. Without
    an optimizer such a replay is refused (test_store.py)."""
    store = Store(2, chunk_bytes=4096)
    store.handle(W[0], Entry(1, Op.INIT, 3, 0, N, N, F32), np.zeros(N, np.float32))
    store.set_updater(optim.Updater(optim.SGD(learning_rate=0.1)))
    for rnd in range(3):
        seq_push(store, W[0], 10 + rnd, grads(rnd, W[0]), rnd + 1)
        seq_push(store, W[1], 20 + rnd, grads(rnd, W[1]), rnd + 1)
    seq_push(store, W[1], 30, grads(3, W[1]), 4)           # round 4: W1 pushed whole, W0 not yet
    store.worker_died(W[1])
    assert store.pushed(W[1]) == {3: 4} and store.pushed(W[0]) == {3: 3}
    after3 = store.keys[3].value.copy()
    got = seq_push(store, W[1], 40, grads(0, W[1]), 1)     # the restart replays step 0
    assert got and all(r.dest == W[1] for r in got)
    np.testing.assert_array_equal(np.concatenate([r.data for r in got]), after3)
    assert seq_push(store, W[1], 41, grads(3, W[1]), 4) == []          # round 4 is open: answered at its close
    np.testing.assert_array_equal(store.keys[3].value, after3)         # nothing applied twice
    closing = seq_push(store, W[0], 42, grads(3, W[0]), 4)
    assert {r.dest for r in closing} == {W[0], W[1]} and store.keys[3].closed == 4
    init_again = store.handle(W[1], Entry(50, Op.INIT, 3, 0, N, N, F32), np.ones(N, np.float32))
    assert init_again[0].entry.error is None                           # replayed init: answered, no change
    assert not np.array_equal(store.keys[3].value, np.ones(N, np.float32))


def test_restarted_workers_and_their_settings_are_in_the_copy():
    """Which workers replay their script, and the settings counted per worker, travel with the
    copy (as events, and in snapshots): a server restarted while worker 0 replays judges its
    replayed set_params as its dead self would. Before, the restart lost the counts, took
    worker 0 (dead when it registered) for a replay of a set_params its dead self had never
    sent, and ignored it: that server's keys trained on at the old rate (exit 0, off by 0.2)."""
    store, mirror = make(opt=optim.SGD(learning_rate=0.1))
    store.setting_applied(W[0], "set_optimizer")
    store.setting_applied(W[0], "set_params")
    store.worker_died(W[0])
    assert store.setting_made_before(W[0], "set_optimizer")     # its restart's first: made before
    replayed(store, mirror)
    assert mirror.replays.replaying == {W[0]}
    assert mirror.replays.applied == {(W[0], "set_optimizer"): 1, (W[0], "set_params"): 1}
    assert mirror.replays.replayed == {(W[0], "set_optimizer"): 1}
    for source in (mirror.snapshot(), snapshot(store)):
        body, frames = encode_events(source)
        fresh = Store(len(W), chunk_bytes=4096)
        restore(fresh, decode_events(body, frames))
        assert fresh.replays.replaying == {W[0]}
        assert fresh.setting_made_before(W[0], "set_params")           # the 1st: its dead self made it
        assert not fresh.setting_made_before(W[0], "set_params")       # the 2nd: new, applied
        assert not fresh.setting_made_before(W[1], "set_params")       # not restarted
    push(store, 3, W[0], 7, grads(0, W[0]), 1)                        # something new: caught up
    replayed(store, mirror)
    assert mirror.replays.replaying == set() and store.replays.replaying == set()
    store.worker_died(W[0])                                           # died again: replays from the start
    replayed(store, mirror)
    assert mirror.replays.replaying == {W[0]} and mirror.replays.replayed == {}


def test_a_setting_sent_again_to_a_restarted_server_is_not_counted_twice():
    """The server counted worker 0's setting (the count reached its backup) and died before its
    answer left; worker 0 sends the same command (same id) to the restart, which must neither
    apply nor count it again. Else a replayed set_optimizer, ignored once, was applied on its
    resend (the recovered Adam moments replaced), or a later replayed set_params was ignored."""
    store, mirror = make(opt=optim.SGD(learning_rate=0.1))
    store.setting_applied(W[0], "set_optimizer", 3)
    store.worker_died(W[0])
    assert not store.setting_resent(W[0], 2)                    # its restart numbers from 1 again
    assert store.setting_made_before(W[0], "set_optimizer", 2)  # the replay: ignored, counted
    replayed(store, mirror)
    body, frames = encode_events(mirror.snapshot())
    fresh = Store(len(W), chunk_bytes=4096)
    restore(fresh, decode_events(body, frames))
    assert fresh.setting_resent(W[0], 2)                        # the same command again: answered only
    assert not fresh.setting_resent(W[0], 4) and not fresh.setting_resent(W[1], 1)
    fresh.setting_applied(W[0], "set_params", 4)
    assert fresh.setting_resent(W[0], 4) and fresh.replays.applied[(W[0], "set_params")] == 1


def test_a_round_half_done_when_the_primary_died_is_applied_once_by_the_backup_that_handed_it_over():
    """The primary dies with two chunks of a round summed and journaled, the round not closed.
    Its restart, given the copy (those chunks left out), gets every push of the round again
    and sends the backup its changes since (the backup still holds what it handed over):
    the round's chunks anew, then its close. The backup applies each chunk once."""
    store, mirror = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    for w in W[:2]:
        push(store, 3, w, 7, grads(0, w), 1)
    for off in (0, 1000):                          # the last worker's first two chunks: two sums journaled
        store.handle(W[2], Entry(7, Op.PUSH, 3, off, 1000, N, F32, None, 0, 1), grads(0, W[2])[off:off + 1000])
    replayed(store, mirror)                        # ... and the primary dies
    body, frames = encode_events(mirror.hand_over())
    restart = Store(len(W), sync=True, chunk_bytes=4096)
    restore(restart, decode_events(body, frames))
    restart.journal = []                           # its changes from the recovery on (Replication._fetched)
    for i, w in enumerate(W):                      # every worker's push of round 1, resent
        push(restart, 3, w, 20 + i, grads(0, w), 1)
    replayed(restart, mirror)                      # the backup holds the copy: only the changes come
    assert mirror.keys[3].closed == 1
    np.testing.assert_array_equal(mirror.keys[3].value, restart.keys[3].value)
    np.testing.assert_array_equal(restart.keys[3].value, _one_round(W))     # the unfaulted job's


def _one_round(workers):
    """Key 3 after round 1 of ``workers``' pushes on an unfaulted store."""
    store, _ = make(opt=optim.SGD(learning_rate=0.1, momentum=0.9))
    for i, w in enumerate(workers):
        push(store, 3, w, 100 + i, grads(0, w), 1)
    return store.keys[3].value
