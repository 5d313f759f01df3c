"""ps's numpy optimizers against MXNet 1.9.1's own updater, step by step (no mocks).

Each case runs the same random gradients through ``mx.optimizer.get_updater(opt)``
(NDArrays of their real shapes) and through ps (flat arrays, optimizer translated by
``spec_from_mxnet`` -> msgpack -> ``from_spec``), with rescale_grad != 1, wd > 0,
clip_gradient, per-key lr/wd multipliers (index and idx2name rules) and a scheduler.
"""
import msgpack
import numpy as np
import pytest

from ps.optim.from_mxnet import spec_from_mxnet
from ps.optim import Updater, from_spec

mx = pytest.importorskip("mxnet")
pytestmark = pytest.mark.mxnet

SHAPES = {0: (3, 4), 1: (5,), 2: (2, 3, 2)}
IDX2NAME = {0: "fc_weight", 1: "fc_bias", 2: "bn_gamma"}  # fc_bias gets wd_mult 0, as in Module
STEPS = 6

# fp32: observed bit-identical; the tolerance is the contract, tighter than any real drift.
FP32_TOL = {"rtol": 1e-6, "atol": 1e-7}
# fp16 weights are the master rounded to fp16: one fp16 ulp (2**-10 relative) covers a
# master that differs in its last fp32 bit and lands on the other side of a rounding boundary.
FP16_TOL = {"rtol": 2.0 ** -10, "atol": 2.0 ** -24}

CASES = [
    ("sgd", {"momentum": 0.9}, 0.1), ("sgd", {}, 0.1),
    ("nag", {"momentum": 0.9}, 0.1), ("nag", {}, 0.1),
    ("adam", {}, 0.01), ("adagrad", {}, 0.1),
    ("rmsprop", {}, 0.01), ("rmsprop", {"centered": True, "clip_weights": 1.5}, 0.01),
    ("adadelta", {}, 1.0),
    ("signum", {"momentum": 0.9, "wd_lh": 0.02}, 0.01), ("signum", {"momentum": 0.0}, 0.01),
    ("ftrl", {}, 0.1),
    ("lamb", {}, 0.01), ("lamb", {"bias_correction": False, "lower_bound": 0.5, "upper_bound": 3.0}, 0.01),
    ("test", {}, 0.1),
]


def make_scheduler(i, base):
    """Cycle through every scheduler, all with decay inside the run and most with warmup."""
    kind = i % 4
    if kind == 0:
        return mx.lr_scheduler.FactorScheduler(step=2, factor=0.7, base_lr=base, warmup_steps=1,
                                               warmup_begin_lr=base / 10)
    if kind == 1:
        return mx.lr_scheduler.MultiFactorScheduler(step=[2, 4], factor=0.5, base_lr=base)
    if kind == 2:
        return mx.lr_scheduler.PolyScheduler(max_update=8, base_lr=base, pwr=2, final_lr=base / 100,
                                             warmup_steps=2, warmup_begin_lr=base / 4)
    return mx.lr_scheduler.CosineScheduler(max_update=8, base_lr=base, final_lr=base / 50, warmup_steps=2,
                                           warmup_begin_lr=base / 3, warmup_mode="constant")


def make_optimizer(i, name, kwargs, base, multi_precision):
    opt = mx.optimizer.create(name, learning_rate=base, lr_scheduler=make_scheduler(i, base), wd=0.01,
                              rescale_grad=0.5, clip_gradient=0.8, multi_precision=multi_precision,
                              param_idx2name=IDX2NAME, **kwargs)
    opt.set_lr_mult({0: 0.5, 2: 2.0})
    opt.set_wd_mult({2: 3.0})
    return opt


def ps_updater(opt):
    wire = msgpack.unpackb(msgpack.packb(spec_from_mxnet(opt)), strict_map_key=False)
    return Updater(from_spec(wire))


def mx_master(name, state):
    """MXNet keeps (state, master) for sgd/nag and (master, state) for the others."""
    return (state[1] if name in ("sgd", "nag") else state[0]).asnumpy().ravel()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16-multi-precision"])
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'plain'}"
                                                     for n, kw, _ in CASES])
def test_matches_mxnet(i, dtype):
    name, kwargs, base = CASES[i]
    fp16 = dtype == np.float16
    opt = make_optimizer(i, name, kwargs, base, multi_precision=fp16)
    ours = ps_updater(opt)  # before MXNet runs: the scheduler and counts are still fresh
    theirs = mx.optimizer.get_updater(opt)
    rng = np.random.RandomState(i)
    init = {k: rng.randn(*s).astype(dtype) for k, s in SHAPES.items()}
    w_mx = {k: mx.nd.array(v, dtype=dtype) for k, v in init.items()}
    w_ps = {k: v.ravel().copy() for k, v in init.items()}
    for _ in range(STEPS):
        for k, shape in SHAPES.items():
            g = (rng.randn(*shape) * 2).astype(dtype)
            theirs(k, mx.nd.array(g, dtype=dtype), w_mx[k])
            ours(k, g.ravel().copy(), w_ps[k])
            if fp16:
                np.testing.assert_allclose(ours.states[k][0], mx_master(name, theirs.states[k]), **FP32_TOL)
                np.testing.assert_allclose(w_ps[k], w_mx[k].asnumpy().ravel(), **FP16_TOL)
            else:
                np.testing.assert_allclose(w_ps[k], w_mx[k].asnumpy().ravel(), **FP32_TOL)
    assert ours.optimizer.num_update == opt.num_update
    assert ours.optimizer.index_update_count == opt._index_update_count


def test_set_learning_rate_mid_run_matches_mxnet():
    opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01)
    ours, theirs = ps_updater(opt), mx.optimizer.get_updater(opt)
    rng = np.random.RandomState(0)
    w0 = rng.randn(7).astype(np.float32)
    w_mx, w_ps = mx.nd.array(w0), w0.copy()
    for step in range(6):
        if step == 3:
            opt.set_learning_rate(0.02)
            ours.optimizer.set_learning_rate(0.02)
        g = rng.randn(7).astype(np.float32)
        theirs(0, mx.nd.array(g), w_mx)
        ours(0, g.copy(), w_ps)
    np.testing.assert_allclose(w_ps, w_mx.asnumpy(), **FP32_TOL)


@pytest.mark.parametrize("i", range(4), ids=["factor", "multifactor", "poly", "cosine"])
def test_schedulers_match_mxnet(i):
    theirs = make_scheduler(i, 0.3)
    spec = spec_from_mxnet(mx.optimizer.SGD(lr_scheduler=theirs))["params"]["lr_scheduler"]
    ours = from_spec({"name": "sgd", "params": {"lr_scheduler": spec}}).lr_scheduler
    for n in [0, 0, 1, 2, 3, 3, 5, 8, 9, 12, 30]:
        assert ours(n) == theirs(n), n


def test_gluon_trainer_param_multipliers():
    params = [mx.gluon.Parameter(f"p{i}", shape=(2,)) for i in range(4)]
    params[0].lr_mult = 0.5
    params[1].wd_mult = 0.0
    params[2].lr_mult, params[2].wd_mult = 3.0, 2.0
    for p in params:
        p.initialize()
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "wd": 0.01, "momentum": 0.9})
    mx_opt = trainer._optimizer
    spec = spec_from_mxnet(mx_opt)
    assert spec["params"]["lr_mult"] == {0: 0.5, 2: 3.0}
    assert spec["params"]["wd_mult"] == {1: 0.0, 2: 2.0}
    ps_opt = from_spec(msgpack.unpackb(msgpack.packb(spec), strict_map_key=False))
    for key in range(4):
        assert ps_opt.get_lr(key) == mx_opt._get_lr(key)
        assert ps_opt.get_wd(key) == mx_opt._get_wd(key)


def test_module_idx2name_wd_rule():
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(mx.sym.BatchNorm(data, name="bn"), num_hidden=3, name="fc")
    mod = mx.mod.Module(net, label_names=None)
    mod.bind(data_shapes=[("data", (2, 4))])
    mod.init_params()
    mod.init_optimizer(kvstore=None, optimizer="sgd", optimizer_params={"wd": 0.1})
    names = mod._optimizer.idx2name
    spec = spec_from_mxnet(mod._optimizer)
    # bn_beta and fc_bias get wd_mult 0; bn_gamma and fc_weight keep 1 (so are not listed).
    assert spec["params"]["wd_mult"] == {i: 0.0 for i, n in names.items() if n in ("bn_beta", "fc_bias")}
    by_name = spec_from_mxnet(mod._optimizer, keys=["fc_weight", "fc_bias"])
    assert by_name["params"]["wd_mult"] == {"fc_bias": 0.0}


def test_unknown_optimizer_and_scheduler_are_named():
    with pytest.raises(ValueError, match=r"optimizer 'FTML'; known: .*sgd"):
        spec_from_mxnet(mx.optimizer.FTML())

    class MySGD(mx.optimizer.SGD):
        pass

    with pytest.raises(ValueError, match="'MySGD'"):
        spec_from_mxnet(MySGD())

    class Step(mx.lr_scheduler.LRScheduler):
        def __call__(self, num_update):
            return self.base_lr

    with pytest.raises(ValueError, match="lr_scheduler 'Step'; known: CosineScheduler, FactorScheduler"):
        spec_from_mxnet(mx.optimizer.SGD(lr_scheduler=Step()))
