"""Two networks trained in turns, a GAN's shape (tests/mxnet/test_horovod_mxnet.py): one
hvd.DistributedTrainer each, prefix= apart, and a third pair of DistributedOptimizer-wrapped
Trainers whose parameter 0 has another shape under the same name. Under the launcher each worker
trains on its own batches; with --local one process trains on both workers' batches."""
import json
import sys

import ps.mxnet as hvd  # noqa: I001  (before mxnet, as Horovod's template imports horovod.mxnet)
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, WORKERS = 6, 4, 2


def batch(rank, step, width):
    rng = np.random.RandomState(1000 * step + 10 * rank + width)
    return rng.uniform(-1, 1, (BATCH, width)).astype(np.float32)


def net(units, inputs):
    n = gluon.nn.Dense(units, in_units=inputs)
    n.initialize(mx.init.Constant(0.1))
    return n


def main():
    local = "--local" in sys.argv
    hvd.init()
    ranks = range(WORKERS) if local else [hvd.rank()]
    # G and D: parameter 0 of each has the same shape (4, 4), and each its own optimizer
    g, d = net(4, 4), net(4, 4)
    tg = hvd.DistributedTrainer(g.collect_params(), "sgd", {"learning_rate": 0.1}, prefix="G")
    td = hvd.DistributedTrainer(d.collect_params(), "adam", {"learning_rate": 0.05}, prefix="D")
    # E and F: DistributedOptimizer names gradients by index alone; their shapes differ
    e, f = net(3, 4), net(5, 4)
    te = gluon.Trainer(e.collect_params(), hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1)),
                       kvstore=None)
    tf = gluon.Trainer(f.collect_params(), hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.2)),
                       kvstore=None)
    # H: Horovod's fp16 compression and gradient_predivide_factor (float16 sums: close, not equal)
    h = net(4, 4)
    th = hvd.DistributedTrainer(h.collect_params(), mx.optimizer.SGD(learning_rate=0.1),
                                compression=hvd.Compression.fp16, gradient_predivide_factor=4.0, prefix="H")
    # K: deferred (no in_units), random weights that differ per rank: broadcast_parameters
    # before the first forward pass makes them rank 0's once they exist (Horovod's MNIST example)
    mx.random.seed(hvd.rank())
    k = gluon.nn.Dense(4)
    k.initialize(mx.init.Xavier())
    hvd.broadcast_parameters(k.collect_params(), root_rank=0)
    tk = hvd.DistributedTrainer(k.collect_params(), "sgd", {"learning_rate": 0.1}, prefix="K")
    for step in range(STEPS):
        x = mx.nd.array(np.concatenate([batch(r, step, 4) for r in ranks]))
        for model, trainer, sign in ((d, td, 1.0), (g, tg, -1.0), (e, te, 1.0), (f, tf, 1.0), (h, th, 0.5),
                                     (k, tk, 1.0)):
            with autograd.record():
                loss = (sign * model(x) + model(x) ** 2).sum()
            loss.backward()
            trainer.step(BATCH * len(ranks))
    print("RESULT " + json.dumps({"rank": hvd.rank(), "weights": {
        name: m.weight.data().asnumpy().ravel().tolist() for name, m in (("G", g), ("D", d), ("E", e), ("F", f), ("H", h), ("K", k))}}),
        flush=True)


if __name__ == "__main__":
    main()
