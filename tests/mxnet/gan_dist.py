"""Three networks, three Trainers with kvstore='dist_sync' in one process, trained in turns
(a GAN's shape; test_adapter.py runs it): each Trainer's store gets its own keys and its own
optimizer on the servers. With --local one process trains on both workers' batches with
kvstore='local' (MXNet's reference: dist_sync = local on the workers' batches together)."""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, WORKERS = 5, 4, 2


def batch(rank, step):
    return np.random.RandomState(100 * step + rank).uniform(-1, 1, (BATCH, 4)).astype(np.float32)


def net():
    n = gluon.nn.Dense(4, in_units=4)        # every network's parameter 0 has shape (4, 4)
    n.initialize(mx.init.Constant(0.1))
    return n


def main():
    local = "--local" in sys.argv
    kind = "local" if local else "dist_sync"
    g, d, e = net(), net(), net()
    tg = gluon.Trainer(g.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kind)
    td = gluon.Trainer(d.collect_params(), "adam", {"learning_rate": 0.05}, kvstore=kind)
    te = gluon.Trainer(e.collect_params(), "rmsprop", {"learning_rate": 0.01}, kvstore=kind,
                       update_on_kvstore=False)
    # a store that only tells the rank: it initializes nothing, so the Trainers' stores
    # still number 0, 1, 2 on the servers
    rank = 0 if local else mx.kv.create("dist_sync").rank
    ranks = range(WORKERS) if local else [rank]

    def step(i):
        x = mx.nd.array(np.concatenate([batch(r, i) for r in ranks]))
        for model, trainer, sign in ((d, td, 1.0), (g, tg, -1.0), (e, te, 0.5)):
            with autograd.record():
                loss = (sign * model(x) + model(x) ** 2).sum()
            loss.backward()
            trainer.step(BATCH)
    for i in range(STEPS):
        if i == 3:
            tg.set_learning_rate(0.05)       # reaches G's optimizer on the servers, not D's
        step(i)
    states = os.path.join(sys.argv[1], f"d{rank}.states")
    td.save_states(states)
    td.load_states(states)
    step(STEPS)
    found = {"rank": rank,
             "weights": {name: m.weight.data().asnumpy().ravel().tolist() for name, m in (("G", g), ("D", d), ("E", e))}}
    if not local:                            # one store object given to two Trainers: refused
        kv = mx.kv.create("dist_sync")
        f1, f2 = net(), net()
        try:
            for f in (f1, f2):
                tr = gluon.Trainer(f.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
                with autograd.record():
                    loss = f(mx.nd.ones((1, 4))).sum()
                loss.backward()
                tr.step(1)
        except ValueError as exc:
            found["refused"] = str(exc)
        try:                                 # D's states (the first store's) into G's store
            tg.load_states(states)
        except ValueError as exc:
            found["states_refused"] = str(exc)
        kv3 = mx.kv.create("dist_sync")      # numpy int keys, as MXNet takes them, in a later store
        kv3.init(np.int64(0), mx.nd.ones((2,)))
        kv3.push(np.int64(0), mx.nd.ones((2,)))
        out = mx.nd.zeros((2,))
        kv3.pull(np.int64(0), out=out)
        found["numpy_key"] = out.asnumpy().tolist()
        try:                                 # errors name the script's key, not the moved one
            kv3.push(0, mx.nd.ones((3,)))
        except ValueError as exc:
            found["shape_refused"] = str(exc)
        try:
            kv3.pull(7, out=out)
        except mx.base.MXNetError as exc:
            found["unknown_refused"] = str(exc)
        c = net()                            # compression for one Trainer would reach all: refused
        tc = gluon.Trainer(c.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="dist_sync",
                           compression_params={"type": "2bit", "threshold": 0.5})
        with autograd.record():
            loss = c(mx.nd.ones((1, 4))).sum()
        loss.backward()
        try:
            tc.step(1)
        except ValueError as exc:
            found["compression_refused"] = str(exc)
    print("RESULT " + json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
