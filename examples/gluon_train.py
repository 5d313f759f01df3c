"""Train a small Gluon MLP on synthetic data with kvstore='dist_sync' on ps.

Every role can run this same script (it imports ps.mxnet first):

    python -m ps.launch -n 2 -s 2 --launcher local python examples/gluon_train.py --epochs 3

or by hand with DMLC_ROLE / DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT / DMLC_NUM_SERVER /
DMLC_NUM_WORKER set for each process. No download: the data is generated.
"""
import argparse
import time

import ps.mxnet  # noqa: F401  (must come before mxnet: servers and the scheduler run here)
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon


def synthetic(rank, workers, samples=4096, features=64, classes=10, seed=0):
    """A linearly separable problem; each worker takes its own share of the rows."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((features, classes))
    x = rng.standard_normal((samples, features)).astype(np.float32)
    y = (x @ w).argmax(axis=1).astype(np.float32)
    return x[rank::workers], y[rank::workers]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()

    kv = mx.kv.create(args.kvstore)
    x, y = synthetic(kv.rank, kv.num_workers)
    data = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=args.batch_size, shuffle=False)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(10))
    mx.random.seed(42)                      # the same initial weights everywhere (broadcast anyway)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), args.optimizer,
                            {"learning_rate": args.lr, "momentum": 0.9} if args.optimizer == "sgd"
                            else {"learning_rate": args.lr}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    metric = mx.metric.Accuracy()
    for epoch in range(args.epochs):
        metric.reset()
        start = time.time()
        for xb, yb in data:
            with autograd.record():
                out = net(xb)
                loss = loss_fn(out, yb)
            loss.backward()
            trainer.step(xb.shape[0])
            metric.update(yb, out)
        print(f"worker {kv.rank}: epoch {epoch} accuracy {metric.get()[1]:.3f} "
              f"({time.time() - start:.2f}s)", flush=True)
    if hasattr(kv, "close"):
        kv.close()


if __name__ == "__main__":
    main()
