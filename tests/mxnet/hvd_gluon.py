"""The Horovod-MXNet template on ps (`import ps.mxnet as hvd`, DistributedOptimizer around an
mx.optimizer, Trainer(kvstore=None)); test_horovod_mxnet.py runs it under the launcher and
alone with --local (one process on both workers' batches)."""
import json
import sys

import ps.mxnet as hvd  # noqa: I001  (before mxnet, as Horovod's template imports horovod.mxnet)
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, WORKERS = 15, 8, 2


def batch(rank, step):
    rng = np.random.RandomState(100 * step + rank)
    return rng.uniform(-1, 1, (BATCH, 10)).astype(np.float32), rng.uniform(-1, 1, (BATCH, 3)).astype(np.float32)


def main():
    local = "--local" in sys.argv
    hvd.init()
    mx.random.seed(5 + hvd.rank())            # different on purpose: broadcast_parameters fixes it
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="tanh", in_units=10), gluon.nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    opt = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=0.01)
    trainer = gluon.Trainer(params, hvd.DistributedOptimizer(opt), kvstore=None)
    ranks = range(WORKERS) if local else [hvd.rank()]
    loss_fn = gluon.loss.L2Loss()
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in ranks))
        x, y = mx.nd.array(np.concatenate(xs)), mx.nd.array(np.concatenate(ys))
        with autograd.record():
            loss = loss_fn(net(x), y).sum()
        loss.backward()
        trainer.step(BATCH * len(ranks))
    mean = hvd.allreduce(mx.nd.array([float(loss.asscalar())]), name="loss").asscalar()
    print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_size": hvd.local_size(),
                                  "mean_loss": float(mean),
                                  "weights": {n: p.data().asnumpy().ravel().tolist() for n, p in params.items()}}),
          flush=True)


if __name__ == "__main__":
    main()
