"""Gluon / Module / kvstore worker for the MXNet adapter tests (also runs server roles).

Imports ps.mxnet before mxnet, so the same command works for every DMLC_ROLE.
Usage: gluon_worker.py SCENARIO OUT.npz [name=python-literal ...]
"""
import ast
import os
import sys

import ps.mxnet  # noqa: F401  (server/scheduler roles run here and exit)
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import custom_optim  # noqa: F401  (registers "halfsgd")

B, D, H, C = 8, 20, 32, 5          # per-worker batch, inputs, hidden, classes


def data(workers, model="mlp"):
    rng = np.random.default_rng(7)
    shape = (workers * B, 16, 16, 16) if model == "conv" else (workers * B, D)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, C, workers * B).astype(np.float32)
    return x, y


def net(dtype="float32", model="mlp"):
    n = gluon.nn.HybridSequential()
    if model == "conv":     # MKL-DNN convolutions: weights may change layout in inference
        n.add(gluon.nn.Conv2D(32, 3, padding=1, activation="relu", in_channels=16),
              gluon.nn.MaxPool2D(2), gluon.nn.Conv2D(32, 3, in_channels=32),
              gluon.nn.Flatten(), gluon.nn.Dense(C, in_units=32 * 6 * 6))
    else:
        n.add(gluon.nn.Dense(H, activation="relu", in_units=D), gluon.nn.Dense(C, in_units=H))
    n.initialize(mx.init.Zero())
    rng = np.random.default_rng(3)
    for p in n.collect_params().values():
        p.set_data(mx.nd.array(rng.standard_normal(p.shape) * (0.05 if model == "conv" else 0.3)))
    if dtype != "float32":
        n.cast(dtype)
    return n


def train(kvstore, rank, workers, steps, opt, opt_args, update_on_kvstore=None, compression=None,
          dtype="float32", lr_after=None, save=None, params=None, states=None, rows=None, lr_mult=None,
          model="mlp", predict=False, exit_early=False, fork=False):
    """Train on this worker's rows; the reference trains on all workers' rows with
    step(B), which is what dist_sync computes (sum of per-worker means). ``predict``:
    an inference forward after every step, not waited for (reads the weights the step is
    writing; MKL-DNN reorders conv weights for it). ``exit_early``: rank 0 returns right
    after its last step, its pushpulls possibly still in MXNet's engine. ``fork``: the
    process forks right after every step (a DataLoader starting its workers would)."""
    x, y = data(workers, model)
    lo, hi = rows or (rank * B, (rank + 1) * B)
    xs, ys = x[lo:hi], y[lo:hi]
    n = net(dtype, model)
    if params is not None:
        n.load_parameters(params)
    if lr_mult:
        list(n.collect_params().values())[lr_mult[0]].lr_mult = lr_mult[1]
    trainer = gluon.Trainer(n.collect_params(), opt, dict(opt_args), kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore, compression_params=compression)
    if states is not None:
        # load_states creates the kvstore; MXNet then refuses a later change of rescale_grad
        # (the batch size), so give the optimizer the one step(B) will use first.
        trainer._optimizer.rescale_grad = trainer._scale / B
        trainer.load_states(states)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        if step == lr_after:
            trainer.set_learning_rate(trainer.learning_rate * 0.1)
        with autograd.record():
            loss = loss_fn(n(mx.nd.array(xs, dtype=dtype)), mx.nd.array(ys, dtype=dtype))
        loss.backward()
        trainer.step(B)
        if predict:
            n(mx.nd.array(xs, dtype=dtype))
        if fork:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        if save and step == save[0] - 1:
            trainer.save_states(save[1])
            n.save_parameters(save[2])
    if exit_early and rank == 0:
        return {}
    if predict:
        # MXNet's race, not ps's: asnumpy() waits for a weight's queued writes, then reads
        # its MKL-DNN layout unlocked, while an inference op still queued may push (and run)
        # the reorder of that weight's layout: SIGSEGV in NDArray::Reorder2Default (seen
        # here 3 times in 183 runs; docs/mxnet.md). A script reads its predictions first.
        mx.nd.waitall()
    # by position: Gluon's name prefixes differ between processes
    return {f"p{i}": v.data().asnumpy().astype(np.float32) for i, v in enumerate(n.collect_params().values())}


def module_fit(kvstore, rank, workers, epochs=3, rows=None):
    x, y = data(workers)
    lo, hi = rows or (rank * B, (rank + 1) * B)
    it = mx.io.NDArrayIter(x[lo:hi], y[lo:hi], batch_size=hi - lo)
    d = mx.sym.Variable("data")
    fc = mx.sym.FullyConnected(d, num_hidden=C, name="fc")
    mod = mx.mod.Module(mx.sym.SoftmaxOutput(fc, name="softmax"), context=mx.cpu())
    rng = np.random.default_rng(3)
    args = {"fc_weight": mx.nd.array(rng.standard_normal((C, D)) * 0.3), "fc_bias": mx.nd.zeros(C)}
    mod.fit(it, num_epoch=epochs, kvstore=kvstore, optimizer="sgd", arg_params=args,
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    arg, _ = mod.get_params()
    return {k: v.asnumpy() for k, v in arg.items()}


def async_kv():
    kv = mx.kv.create("dist_async")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    kv.init(3, mx.nd.ones((2, 3)))
    for _ in range(3):
        for turn in range(kv.num_workers):
            if turn == kv.rank:
                kv.push(3, mx.nd.ones((2, 3)) * (kv.rank + 1))
                out = mx.nd.zeros((2, 3))
                kv.pull(3, out=out)          # pull waits for this worker's push
            kv._barrier()
    out = mx.nd.zeros((2, 3))
    kv.pull(3, out=out)
    return kv, {"w": out.asnumpy()}


def engine_error():
    """A pushpull the servers refuse (dist_async, no optimizer) while it runs in MXNet's
    engine: waiting does not hang; mx.nd.waitall() raises the servers' error (where MXNet
    raises its own engine errors), and after a wait that does not (an array's), the next
    call does."""
    kv = mx.kv.create("dist_async")
    kv.init(3, mx.nd.ones((2, 3)))
    out = mx.nd.zeros((2, 3))
    for wait in ("waitall", "next call"):
        kv.pushpull(3, mx.nd.ones((2, 3)), out=out)
        try:
            if wait == "waitall":
                mx.nd.waitall()
            else:
                out.wait_to_read()
                kv.pull(3, out=out)
        except Exception as exc:   # noqa: BLE001 - the test checks type and text
            print(f"{wait} raised {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"{wait}: no error", flush=True)
    return kv, {"engine_ops": np.array(kv.engine_ops)}


if __name__ == "__main__":
    scenario, out = sys.argv[1], sys.argv[2]
    kw = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])}
    if scenario == "async":
        kv, result = async_kv()
    elif scenario == "engine_error":
        kv, result = engine_error()
    else:
        kv = mx.kv.create(kw.pop("kvstore", "dist_sync"))
        fn = module_fit if scenario == "module" else train
        result = fn(kv, kv.rank, kv.num_workers, **kw)
    result["__rank"] = np.array(kv.rank)
    result["__engine_ops"] = np.array(getattr(kv, "engine_ops", -1))
    np.savez(out, **result)
