"""MXNet training with row_sparse parameters, knowing nothing of ps (no `import ps`): run by
test_sparse_mxnet.py under `python -m ps.launch`, where `kvstore='dist_sync'` (or async)
must land on ps and train with MXNet's numbers.

    python plain_sparse.py gluon|module dist_sync|dist_async   # one worker of a job
    python plain_sparse.py gluon|module local                  # reference: one process, every worker's batches

gluon: an embedding table (row_sparse weight and gradient, lazy SGD with momentum and wd)
and a dense layer (dense gradient); module: sparse linear regression over CSR data
(`sparse.dot(csr, w)`, w row_sparse), Adam (lazy).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, ROWS, DIM = 5, 6, 500, 4
WORKERS = int(os.environ.get("SPARSE_WORKERS", "2"))


def ids(rank, step):
    return np.random.RandomState(100 * step + rank).randint(0, ROWS, BATCH)


def gluon_main(kvstore, ranks):
    emb = gluon.Parameter("emb", shape=(ROWS, DIM), stype="row_sparse", grad_stype="row_sparse",
                          init=mx.init.Constant(0.5))
    dense = gluon.Parameter("dense", shape=(DIM, 1), init=mx.init.Constant(0.1))
    emb.initialize()
    dense.initialize()
    emb.set_data(mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (ROWS, DIM))).tostype("row_sparse"))
    # rescale_grad given up front: the first row_sparse_data() sets up the kvstore before any
    # step, and MXNet then refuses a step whose batch size changes it (its own rule, native too)
    trainer = gluon.Trainer([emb, dense], "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3,
                                                  "rescale_grad": 1.0 / BATCH},
                            kvstore=kvstore)
    for step in range(STEPS):
        rows = mx.nd.array(np.concatenate([ids(r, step) for r in ranks]))
        with autograd.record():
            table = emb.row_sparse_data(rows)
            out = mx.nd.dot(mx.nd.Embedding(rows, table, ROWS, DIM, sparse_grad=True), dense.data())
            loss = ((out - 1) ** 2).sum()
        loss.backward()
        trainer.step(1)                 # rescale_grad already holds 1 / BATCH
    everything = mx.nd.arange(ROWS)
    return trainer, {"emb": emb.row_sparse_data(everything).asnumpy().ravel().tolist(),
                     "dense": dense.data().asnumpy().ravel().tolist()}


def module_main(kvstore, ranks):
    data = mx.sym.Variable("data", stype="csr")
    w = mx.sym.Variable("w", shape=(ROWS, 1), stype="row_sparse", init=mx.init.Constant(0.2))
    label = mx.sym.Variable("label")
    out = mx.sym.LinearRegressionOutput(mx.sym.sparse.dot(data, w), label=label)
    n = BATCH * len(ranks)
    mod = mx.mod.Module(out, data_names=["data"], label_names=["label"])
    mod.bind(data_shapes=[("data", (n, ROWS))], label_shapes=[("label", (n, 1))])
    mod.init_params()
    mod.init_optimizer(kvstore=kvstore, optimizer="adam", optimizer_params={"learning_rate": 0.05})
    for step in range(STEPS):
        dense = np.zeros((n, ROWS), np.float32)
        for i, row in enumerate(np.concatenate([ids(r, step) for r in ranks])):
            dense[i, row] = 1.0 + (i % BATCH) % 3
        labels = np.concatenate([np.arange(BATCH) % 5 + r for r in ranks]).reshape(n, 1)
        batch = mx.io.DataBatch([mx.nd.array(dense).tostype("csr")], [mx.nd.array(labels)])
        mod.prepare(batch, sparse_row_id_fn=lambda b: {"w": b.data[0].indices})
        mod.forward_backward(batch)
        mod.update()
    mod.prepare(None, sparse_row_id_fn=lambda _: {"w": mx.nd.arange(ROWS)})
    params, _ = mod.get_params()
    return mod, {"w": params["w"].asnumpy().ravel().tolist()}


def main():
    api, kind = sys.argv[1], sys.argv[2]
    kv = mx.kv.create(kind)
    ranks = range(WORKERS) if kind == "local" else [kv.rank]
    owner, weights = (gluon_main if api == "gluon" else module_main)(kv, ranks)
    store = owner._kvstore
    print("RESULT " + json.dumps({"kvstore": f"{type(store).__module__}.{type(store).__name__}",
                                  "rank": 0 if kind == "local" else kv.rank, "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
