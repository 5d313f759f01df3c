"""Sync rounds that run an elementwise optimizer chunk by chunk: bit-identical to one update
of the whole key with the summed gradient, one update count per key per round."""
import numpy as np
import pytest

from ps.frames import dtype_code
from ps.keys import chunks
from ps.message import Entry, Op
from ps.optim import REGISTRY, Updater, from_spec
from ps.server.store import Store
from ps.server.values import Values

W0, W1 = 9, 11
KEYS = (3, 4)
TOTAL, CHUNK = 50, 8        # elements per key, per pushed chunk: 7 chunks, the last one short

ELEMENTWISE = {
    "sgd": ("sgd", {}), "sgd_momentum": ("sgd", {"momentum": 0.9}), "nag": ("nag", {"momentum": 0.8}),
    "adam": ("adam", {"beta1": 0.8}), "adagrad": ("adagrad", {"eps": 1e-6}),
    "rmsprop": ("rmsprop", {}), "rmsprop_centered": ("rmsprop", {"centered": True, "clip_weights": 2.0}),
    "adadelta": ("adadelta", {"rho": 0.95}), "signum": ("signum", {"wd_lh": 0.01}),
    "signsgd": ("signum", {"momentum": 0.0}), "ftrl": ("ftrl", {"lamda1": 0.02}),
}
SCHED = {"name": "factor", "params": {"step": 2, "factor": 0.5, "base_lr": 0.1,
                                       "warmup_steps": 2, "warmup_begin_lr": 0.01}}


def spec(name, params, sched=None, multi_precision=False):
    params = {**params, "wd": 0.01, "rescale_grad": 0.5, "clip_gradient": 1.0, "lr_mult": {4: 0.5},
              "multi_precision": multi_precision}
    if sched is not None:
        params["lr_scheduler"] = sched
    return {"name": name, "params": params}


def entry(ts, op, key, off, n, dtype):
    return Entry(ts, int(op), key, off, n, TOTAL, dtype_code(dtype))


def bits(a):
    return a.view(f"u{a.itemsize}")


def pulled(replies, key):
    parts = sorted((r.entry[3], r.data.copy()) for r in replies if r.entry[2] == key and r.data is not None)
    return np.concatenate([p for _, p in parts])


def new_store(sp, dtype):
    s = Store(2, sync=True, chunk_bytes=CHUNK * np.dtype(dtype).itemsize)
    opt = from_spec(sp)
    s.set_updater(Updater(opt), opt.multi_precision)
    return s


def train(sp, rounds=4, dtype=np.float32, seed=0):
    """Run ``rounds`` sync rounds per key through a Store, (worker, chunk) frames shuffled,
    and the same rounds through a plain Updater on the whole summed gradient."""
    rng = np.random.default_rng(seed)
    s, ref = new_store(sp, dtype), Updater(from_spec(sp))
    want = {}
    for k in KEYS:
        w = rng.standard_normal(TOTAL).astype(dtype)
        (ack,) = s.handle(W0, entry(1, Op.INIT, k, 0, TOTAL, dtype), w.copy())
        assert ack.entry[7] is None
        want[k] = w
    pieces = chunks(TOTAL, 1, CHUNK)
    for r in range(rounds):
        for k in KEYS:
            g = {w: (rng.standard_normal(TOTAL) * 2).astype(dtype) for w in (W0, W1)}
            ts = {W0: 100 + r, W1: 200 + r}
            frames = [(w, off, n) for w in (W0, W1) for off, n in pieces]
            rng.shuffle(frames)                      # chunks of both workers interleaved
            replies = []
            for w, off, n in frames:
                replies += s.handle(w, entry(ts[w], Op.PUSH | Op.PULL, k, off, n, dtype), g[w][off:off + n])
            total = g[W0].astype(s.keys[k].merge_dtype)
            total += g[W1]
            ref(k, total, want[k])
            got = {w: pulled([x for x in replies if x.dest == w], k) for w in (W0, W1)}
            for w in (W0, W1):
                np.testing.assert_array_equal(bits(got[w]), bits(want[k]), err_msg=f"round {r} key {k}")
    assert s.opts.updaters[0].optimizer.index_update_count == ref.optimizer.index_update_count == \
        {k: rounds for k in KEYS}
    for k in KEYS:
        np.testing.assert_array_equal(bits(s.keys[k].value), bits(want[k]))
    return s


def no_full_buffer(self, ks, rnd):
    raise AssertionError("an elementwise optimizer must not get a full-size merge buffer")


def test_elementwise_flags():
    assert {n for n, c in REGISTRY.items() if not c.elementwise} == {"lamb"}


@pytest.mark.parametrize("sched", [None, SCHED], ids=["const-lr", "factor-sched"])
@pytest.mark.parametrize("case", sorted(ELEMENTWISE))
def test_chunkwise_update_is_bit_identical(case, sched, monkeypatch):
    monkeypatch.setattr(Values, "_merge_buffer", no_full_buffer)
    train(spec(*ELEMENTWISE[case], sched=sched))


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "rmsprop_centered"])
def test_chunkwise_multi_precision_fp16(case, monkeypatch):
    monkeypatch.setattr(Values, "_merge_buffer", no_full_buffer)
    s = train(spec(*ELEMENTWISE[case], sched=SCHED, multi_precision=True), dtype=np.float16)
    assert s.keys[3].merge_dtype == np.float32          # fp16 grads summed in fp32, as before


@pytest.mark.parametrize("sched", [None, SCHED], ids=["const-lr", "factor-sched"])
def test_lamb_falls_back_to_the_full_sum(sched):
    s = train(spec("lamb", {"lower_bound": 0.1, "upper_bound": 10.0}, sched=sched))
    assert s.keys[3].spare is not None                    # the round's full-size sum was used


def test_updater_chunks_equal_one_update_in_any_order():
    rng = np.random.default_rng(1)
    for name, params in ELEMENTWISE.values():
        sp = spec(name, params, sched=SCHED)
        whole, parts = Updater(from_spec(sp)), Updater(from_spec(sp))
        w1 = rng.standard_normal(TOTAL).astype(np.float32)
        w2 = w1.copy()
        for _ in range(3):
            g = rng.standard_normal(TOTAL).astype(np.float32)
            whole(4, g, w1)
            parts.begin(4, w2)
            for off, n in rng.permutation(chunks(TOTAL, 1, CHUNK)):
                parts.update_chunk(4, off, g[off:off + n], w2)
            np.testing.assert_array_equal(bits(w1), bits(w2), err_msg=name)
        assert parts.optimizer.index_update_count == {4: 3}
    with pytest.raises(TypeError, match="not elementwise"):
        Updater(from_spec(spec("lamb", {}))).begin(4, w1)


def test_a_later_round_waits_for_the_earlier_one():
    """W1's chunks of its next push arrive before the last chunk of its current one: the
    next round's chunks are applied only after the current round closed and its replies
    were made, which must still carry the current round's value."""
    sp = spec("adam", {}, sched=SCHED)
    s, ref = new_store(sp, np.float32), Updater(from_spec(sp))
    rng = np.random.default_rng(2)
    w = rng.standard_normal(TOTAL).astype(np.float32)
    s.handle(W0, entry(1, Op.INIT, 3, 0, TOTAL, np.float32), w.copy())
    g = [[rng.standard_normal(TOTAL).astype(np.float32) for _ in range(2)] for _ in range(2)]
    pieces = chunks(TOTAL, 1, CHUNK)
    op = Op.PUSH | Op.PULL

    def send(worker, ts, grad, sel):
        out = []
        for off, n in sel:
            out += s.handle(worker, entry(ts, op, 3, off, n, np.float32), grad[off:off + n])
        return out

    assert send(W0, 10, g[0][0], pieces) == []
    assert send(W0, 11, g[1][0], pieces) == []             # W0 is already in round 2
    assert send(W1, 20, g[0][1], pieces[:-1]) == []
    assert send(W1, 21, g[1][1], pieces) == []              # round 2 complete, waits for round 1
    replies = send(W1, 20, g[0][1], pieces[-1:])            # closes round 1, then round 2
    ref(3, g[0][0] + g[0][1], w)
    first = w.copy()
    ref(3, g[1][0] + g[1][1], w)
    by_ts = {ts: pulled([r for r in replies if r.entry[0] == ts], 3) for ts in (10, 11, 20, 21)}
    for ts, want in ((10, first), (20, first), (11, w), (21, w)):
        np.testing.assert_array_equal(bits(by_ts[ts]), bits(want), err_msg=f"ts {ts}")
    assert s.opts.updaters[0].optimizer.index_update_count == {3: 2}


def test_no_optimizer_assigns_the_sum_chunk_by_chunk():
    s = Store(2, sync=True, chunk_bytes=CHUNK * 4)
    a = np.arange(TOTAL, dtype=np.float32)
    s.handle(W0, entry(1, Op.INIT, 3, 0, TOTAL, np.float32), np.zeros(TOTAL, np.float32))
    assert s.handle(W0, entry(2, Op.PULL, 3, 0, TOTAL, np.float32), None)   # answered at once
    before = s.keys[3].value
    replies = []
    for w, off, n in [(w, off, n) for off, n in chunks(TOTAL, 1, CHUNK) for w in (W1, W0)]:
        replies += s.handle(w, entry(3, Op.PUSH | Op.PULL, 3, off, n, np.float32), a[off:off + n] * (w - 8))
    np.testing.assert_array_equal(pulled([r for r in replies if r.dest == W0], 3), a * 4)
    assert s.keys[3].value is not before and not before.any()   # the pull's unsent reply kept its value


def test_lr_is_fixed_when_the_update_begins():
    """Other keys' updates between two chunks move num_update (and so a scheduler's lr):
    the chunks of one update all use the lr of its begin, as a whole update at that time."""
    sp = spec("sgd", {"momentum": 0.9}, sched=SCHED)
    whole, parts = Updater(from_spec(sp)), Updater(from_spec(sp))
    rng = np.random.default_rng(3)
    wa, wb = rng.standard_normal(TOTAL).astype(np.float32), rng.standard_normal(TOTAL).astype(np.float32)
    pa, pb = wa.copy(), wb.copy()
    ga, gb = rng.standard_normal(TOTAL).astype(np.float32), rng.standard_normal(TOTAL).astype(np.float32)
    whole(3, ga, wa)
    for _ in range(3):
        whole(4, gb, wb)
    parts.begin(3, pa)
    parts.update_chunk(3, 0, ga[:CHUNK], pa)
    for _ in range(3):
        parts(4, gb, pb)
    parts.update_chunk(3, CHUNK, ga[CHUNK:], pa)
    np.testing.assert_array_equal(bits(pa), bits(wa))
    np.testing.assert_array_equal(bits(pb), bits(wb))


def test_optimizer_cannot_change_while_a_round_is_half_applied():
    s = new_store(spec("sgd", {"momentum": 0.9}), np.float32)
    for w in (W0, W1):
        s.handle(w, entry(1, Op.INIT if w == W0 else Op.PULL, 3, 0, TOTAL, np.float32),
                 np.zeros(TOTAL, np.float32) if w == W0 else None)
    for w in (W0, W1):          # both workers send the first chunk only: it is applied, the round stays open
        s.handle(w, entry(2, Op.PUSH, 3, 0, CHUNK, np.float32), np.ones(CHUNK, np.float32))
    with pytest.raises(RuntimeError, match=r"half applied"):
        s.set_updater(Updater(from_spec(spec("lamb", {}))))


def test_a_subclass_must_declare_itself_elementwise():
    class Scaled(REGISTRY["sgd"]):           # inherits elementwise = True, but says nothing itself
        pass
    assert Updater(REGISTRY["sgd"]()).elementwise
    assert not Updater(Scaled()).elementwise
