"""Numpy-only checks of ps.optim: specs, hand-computed updates, state save/load, multi-precision."""
import math

import msgpack
import numpy as np
import pytest

from ps.optim.lr_scheduler import SCHEDULERS, scheduler_from_spec
from ps.optim import REGISTRY, SGD, Adam, Updater, from_spec

SCHED_PARAMS = {
    "factor": {"step": 3, "factor": 0.5, "base_lr": 0.1, "warmup_steps": 2, "warmup_begin_lr": 0.01},
    "multifactor": {"step": [2, 5], "factor": 0.3, "base_lr": 0.1},
    "poly": {"max_update": 10, "pwr": 2, "base_lr": 0.1, "final_lr": 0.001, "warmup_steps": 2},
    "cosine": {"max_update": 10, "base_lr": 0.1, "final_lr": 0.01, "warmup_steps": 3,
               "warmup_mode": "constant", "warmup_begin_lr": 0.02},
}
OPT_PARAMS = {
    "sgd": {"momentum": 0.9}, "nag": {"momentum": 0.8}, "adam": {"beta1": 0.8},
    "adagrad": {"eps": 1e-6}, "rmsprop": {"centered": True, "clip_weights": 2.0},
    "adadelta": {"rho": 0.95}, "signum": {"wd_lh": 0.01}, "ftrl": {"lamda1": 0.02},
    "lamb": {"lower_bound": 0.1, "upper_bound": 10.0}, "test": {},
    "torchsgd": {"momentum": 0.9, "nesterov": True}, "torchadam": {"amsgrad": True},
}


def roundtrip(obj):
    return msgpack.unpackb(msgpack.packb(obj), strict_map_key=False)


def assert_plain(obj):
    """Only the types a spec may hold, so any msgpack peer can read it."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, (str, int)), k
            assert_plain(v)
    elif isinstance(obj, list):
        for v in obj:
            assert_plain(v)
    else:
        assert obj is None or type(obj) in (str, int, float, bool), repr(obj)


def spec(name, sched="factor", **extra):
    params = {**OPT_PARAMS[name], "wd": 0.01, "rescale_grad": 0.5, "clip_gradient": 1.0,
              "lr_mult": {0: 0.5}, "wd_mult": {3: 0.0}, "multi_precision": True,
              "lr_scheduler": {"name": sched, "params": SCHED_PARAMS[sched]}, **extra}
    return {"name": name, "params": params}


def test_every_optimizer_is_covered():
    assert set(OPT_PARAMS) == set(REGISTRY)
    assert set(SCHED_PARAMS) == set(SCHEDULERS)


@pytest.mark.parametrize("sched", sorted(SCHED_PARAMS))
@pytest.mark.parametrize("name", sorted(OPT_PARAMS))
def test_spec_roundtrip_through_msgpack(name, sched):
    out = from_spec(spec(name, sched)).to_spec()
    assert_plain(out)
    assert roundtrip(out) == out
    assert from_spec(roundtrip(out)).to_spec() == out
    assert out["params"]["lr_mult"] == {0: 0.5} and out["params"]["wd_mult"] == {3: 0.0}
    assert out["params"]["lr_scheduler"]["name"] == sched


@pytest.mark.parametrize("sched", sorted(SCHED_PARAMS))
def test_scheduler_spec_carries_its_state(sched):
    s = scheduler_from_spec({"name": sched, "params": SCHED_PARAMS[sched]})
    [s(n) for n in range(7)]
    copy = scheduler_from_spec(roundtrip(s.to_spec()))
    assert [copy(n) for n in range(7, 20)] == [s(n) for n in range(7, 20)]


def test_scheduler_values():
    factor = scheduler_from_spec({"name": "factor", "params": SCHED_PARAMS["factor"]})
    assert [factor(n) for n in (0, 1, 2, 3, 4, 7, 10)] == pytest.approx(
        [0.01, 0.055, 0.1, 0.1, 0.05, 0.025, 0.0125])
    cosine = scheduler_from_spec({"name": "cosine", "params": SCHED_PARAMS["cosine"]})
    assert [cosine(n) for n in (0, 2, 3, 10, 11)] == pytest.approx(
        [0.02, 0.02, 0.1, 0.01, 0.01])
    assert cosine(5) == pytest.approx(0.01 + 0.09 * (1 + math.cos(math.pi * 2 / 7)) / 2)


def test_unknown_names_are_value_errors_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"'foo'.*adam.*sgd"):
        from_spec({"name": "foo", "params": {}})
    with pytest.raises(ValueError, match=r"'step'.*cosine.*factor"):
        from_spec({"name": "sgd", "params": {"lr_scheduler": {"name": "step", "params": {}}}})
    with pytest.raises(ValueError, match="bad parameters for optimizer 'sgd'"):
        from_spec({"name": "sgd", "params": {"momentun": 0.9}})
    with pytest.raises(ValueError, match="a dict with a 'name'"):
        from_spec(["sgd"])


def test_multiplier_keys_are_ints():
    opt = from_spec({"name": "sgd", "params": {"lr_mult": {"3": 0.5, 4: 2.0}}})
    assert opt.lr_mult == {3: 0.5, 4: 2.0}
    with pytest.raises(ValueError, match="int keys"):
        from_spec({"name": "sgd", "params": {"wd_mult": {"fc_weight": 0.0}}})


def test_sgd_momentum_by_hand():
    opt = SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5)
    up, w = Updater(opt), np.array([1.0, -2.0], dtype=np.float32)
    for _ in range(2):
        up(0, np.array([0.5, 1.5], dtype=np.float32), w)
    # mom1 = -lr*wd*w0 - lr*rs*g = [-0.026, -0.073]; mom2 = 0.9*mom1 - lr*wd*w1 - lr*rs*g
    np.testing.assert_allclose(up.states[0], [-0.049374, -0.138627], rtol=1e-6)
    np.testing.assert_allclose(w, [0.924626, -2.211627], rtol=1e-6)


def test_adam_two_steps_by_hand():
    # Betas exact in float32: MXNet computes 1 - beta2 in float32, where 0.999 loses 1e-5.
    lr, b1, b2, eps = 0.1, 0.75, 0.9375, 1e-8
    up, w = Updater(Adam(learning_rate=lr, beta1=b1, beta2=b2)), np.array([1.0, -0.5], dtype=np.float32)
    grads = [np.array([0.5, -2.0]), np.array([-1.0, 0.25])]
    ref, m, v = w.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        up(7, g.astype(np.float32), w)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        ref = ref - lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(w, ref, rtol=1e-6)
    assert up.optimizer.index_update_count == {7: 2}


def test_update_counts_follow_mxnet():
    up = Updater(SGD(begin_num_update=5))
    w = np.zeros(2, dtype=np.float32)
    for key in (0, 0, 1):
        up(key, w.copy(), w)
    assert up.optimizer.index_update_count == {0: 7, 1: 6}
    assert up.optimizer.num_update == 7


def test_set_learning_rate_as_mxnet():
    opt = SGD(learning_rate=0.1)
    opt.set_learning_rate(0.05)
    assert opt.learning_rate == 0.05 and opt.to_spec()["params"]["learning_rate"] == 0.05
    sched = from_spec(spec("sgd"))
    with pytest.raises(UserWarning, match="LRScheduler"):
        sched.set_learning_rate(0.05)


def test_learning_rate_overrides_scheduler_base_lr():
    opt = SGD(learning_rate=0.2, lr_scheduler={"name": "factor", "params": {"step": 2, "base_lr": 1.0}})
    assert opt.lr_scheduler.base_lr == 0.2
    out = opt.to_spec()["params"]
    assert out["learning_rate"] is None and out["lr_scheduler"]["params"]["base_lr"] == 0.2


def run(up, weights, steps, seed):
    rng = np.random.RandomState(seed)
    for _ in range(steps):
        for key, w in weights.items():
            up(key, rng.randn(w.size).astype(w.dtype), w)


@pytest.mark.parametrize("name", sorted(OPT_PARAMS))
def test_state_save_load_resumes_exactly(name):
    s = spec(name, "factor")
    rng = np.random.RandomState(0)
    weights = {0: rng.randn(5).astype(np.float32), 9: rng.randn(3).astype(np.float16)}
    up = Updater(from_spec(s))
    run(up, weights, 3, seed=1)
    blob = up.get_states()
    assert isinstance(blob, bytes) and b"pickle" not in blob
    resumed_weights = {k: w.copy() for k, w in weights.items()}
    run(up, weights, 3, seed=2)

    resumed = Updater(from_spec(s))
    resumed.set_states(blob)
    assert resumed.states[9][0].dtype == np.float32  # the fp16 key's master copy survived
    run(resumed, resumed_weights, 3, seed=2)
    for k, w in weights.items():
        np.testing.assert_array_equal(resumed_weights[k], w)
    assert resumed.optimizer.num_update == up.optimizer.num_update
    assert resumed.optimizer.lr_scheduler.to_spec() == up.optimizer.lr_scheduler.to_spec()


def test_loaded_state_must_match_the_layout():
    up = Updater(from_spec(spec("adam")))
    up(0, np.ones(4, np.float32), np.ones(4, np.float32))
    blob = up.get_states()
    other = Updater(from_spec(spec("adam")))
    other.set_states(blob)
    with pytest.raises(ValueError, match="same job layout"):
        other(0, np.ones(5, np.float32), np.ones(5, np.float32))
    with pytest.raises(ValueError, match="same job layout"):  # fp16 + multi_precision needs a master
        other(0, np.ones(4, np.float16), np.ones(4, np.float16))
    with pytest.raises(ValueError, match="saved by 'adam'"):
        Updater(from_spec(spec("sgd"))).set_states(blob)
    with pytest.raises(ValueError, match="not an optimizer state"):
        Updater(SGD()).set_states(b"\x93\x01\x02\x03")


def test_fp16_multi_precision_keeps_an_fp32_master():
    def train(multi_precision):
        up = Updater(SGD(learning_rate=1e-4, multi_precision=multi_precision))
        w = np.ones(3, dtype=np.float16)
        for _ in range(10):
            up(0, np.ones(3, dtype=np.float16), w)
        return up, w

    up, w = train(True)
    master = up.states[0][0]
    assert master.dtype == np.float32 and w.dtype == np.float16
    np.testing.assert_allclose(master, 0.999, rtol=1e-6)
    np.testing.assert_array_equal(w, np.float16(0.999))
    # Without a master copy each 1e-4 step is below half an fp16 ulp of 1.0 and is lost.
    np.testing.assert_array_equal(train(False)[1], 1.0)
