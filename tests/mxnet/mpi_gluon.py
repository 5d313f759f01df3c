"""An MXNet Gluon script as the dist_sync_mpi proposal's users write it (no `import ps`), for
test_mpi_mode.py: ``--kvstore NAME`` as MXNet's examples take it. Each rank prints one
``RESULT {json}`` line: its rank, the store's type, its DMLC_ROLE, a digest of the trained
weights, and what the proposal's ``broadcast(key, value, root_rank)`` gave it."""
import argparse
import hashlib
import json
import os
import threading

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, IN = 6, 8, 12


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvstore", default="dist_sync")
    opt = parser.parse_args()
    kv = mx.kv.create(opt.kvstore)
    root = mx.nd.full((3,), kv.rank + 1.0)
    if kv.num_workers > 1:
        kv.broadcast(99, root, 1)               # the proposal's form: rank 1's value, written into `root`
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=IN), gluon.nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier(magnitude=1.0))
    for i, p in enumerate(net.collect_params().values()):      # the same start on every rank
        p.set_data(mx.nd.array(np.random.RandomState(i).uniform(-0.3, 0.3, p.shape)))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.L2Loss()
    for step in range(STEPS):
        rng = np.random.RandomState(100 * step + kv.rank)
        x = mx.nd.array(rng.uniform(-1, 1, (BATCH, IN)))
        y = mx.nd.array(rng.uniform(-1, 1, (BATCH, 3)))
        with autograd.record():
            loss = loss_fn(net(x), y).sum()
        loss.backward()
        trainer.step(BATCH)
    digest = hashlib.sha256(b"".join(p.data().asnumpy().tobytes() for p in net.collect_params().values()))
    servers = [t.name for t in threading.enumerate() if t.name == "ps-joint-server"]
    line = {"rank": kv.rank, "type": kv.type, "role": os.environ.get("DMLC_ROLE"), "digest": digest.hexdigest(),
            "root": root.asnumpy().tolist(), "server_threads": len(servers)}
    os.write(1, f"RESULT {json.dumps(line)}\n".encode())      # one write: mpirun interleaves prints


if __name__ == "__main__":
    main()
