"""Train a small convolutional network on handwritten digits with Gluon, data-parallel.

A plain MXNet script: it does not import ps. `python -m ps.launch` gives every process
ps's import hook, so `kvstore='dist_sync'` below runs on ps's parameter servers:

    python -m ps.launch -n 2 -s 2 --launcher local python examples/train_digits.py
    python examples/train_digits.py --kvstore local          # the same training, one process

The data are the UCI handwritten digits' test set, 1,797 images of 8x8 pixels
(examples/data/digits.csv.gz: nothing is downloaded). Every worker shuffles the training set with the same seed and takes its
share of each global batch, and `trainer.step` divides by the global batch size (the servers
sum the workers' gradients), so the job makes the same updates as one process does.
"""
import argparse
import json
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

TEST_SIZE = 360
DATA = Path(__file__).resolve().parent / "data" / "digits.csv.gz"    # 64 pixels (0..16), then the digit


def digits(seed=0):
    """(train x, train y, test x, test y): images scaled to [0, 1], shaped N x 1 x 8 x 8."""
    rows = np.loadtxt(DATA, delimiter=",")
    x = (rows[:, :64].reshape(-1, 8, 8) / 16.0).astype(np.float32)[:, None]
    y = rows[:, 64].astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(y))
    test, train = order[:TEST_SIZE], order[TEST_SIZE:]
    return x[train], y[train], x[test], y[test]


def network():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"),
            gluon.nn.MaxPool2D(pool_size=2),
            gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"),
            gluon.nn.Dense(10))
    return net


def accuracy(net, x, y):
    return float((net(mx.nd.array(x)).argmax(axis=1).asnumpy() == y).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch, split across the workers")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--quiet", action="store_true", help="no progress lines, only the result")
    ap.add_argument("--results", help="rank 0 writes its final numbers here (JSON)")
    args = ap.parse_args()

    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    if args.batch_size % workers:
        ap.error(f"--batch-size {args.batch_size} does not split evenly over {workers} workers")
    x_train, y_train, x_test, y_test = digits()

    mx.random.seed(1)                        # the same initial weights on every worker
    net = network()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9},
                            kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = len(y_train) // args.batch_size
    step_times = []
    for epoch in range(args.epochs):
        order = np.random.RandomState(100 + epoch).permutation(len(y_train))
        loss_sum = correct = seen = 0.0
        start = time.perf_counter()
        for step in range(steps):
            mine = order[step * args.batch_size:(step + 1) * args.batch_size][rank::workers]
            x, y = mx.nd.array(x_train[mine]), mx.nd.array(y_train[mine])
            t0 = time.perf_counter()
            with autograd.record():
                out = net(x)
                loss = loss_fn(out, y)
            loss.backward()
            trainer.step(args.batch_size)    # servers sum the workers' gradients: the global mean
            loss_sum += float(loss.sum().asscalar())
            step_times.append(time.perf_counter() - t0)
            correct += float((out.argmax(axis=1) == y).sum().asscalar())
            seen += len(mine)
        if not args.quiet:
            print(f"worker {rank}: epoch {epoch + 1}/{args.epochs}  loss {loss_sum / seen:.3f}  "
                  f"train accuracy {correct / seen:.3f}  {seen / (time.perf_counter() - start):,.0f} samples/s",
                  flush=True)

    test_acc = accuracy(net, x_test, y_test)
    step_ms = 1000 * float(np.median(step_times))
    stats = kv.transport_stats() if hasattr(kv, "transport_stats") else {}   # ps's kvstore only
    moved = stats.get("bytes_sent", 0) + stats.get("bytes_received", 0)
    per_step = moved / max(len(step_times), 1)
    if not args.quiet:
        print(f"worker {rank}: test accuracy {test_acc:.3f}  step {step_ms:.1f} ms"
              + (f"  {per_step / 1e6:.3f} MB moved per step" if moved else ""), flush=True)
    if args.results and rank == 0:
        with open(args.results, "w") as f:
            json.dump({"kvstore": args.kvstore, "workers": workers, "test_accuracy": test_acc,
                       "step_ms": step_ms, "bytes_per_step": per_step, "steps": len(step_times),
                       "parameters": sum(p.data().size for p in net.collect_params().values())}, f)


if __name__ == "__main__":
    main()
