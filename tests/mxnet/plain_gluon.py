"""An MXNet Gluon training script that knows nothing of ps (no `import ps`): run by
test_autoload.py under `python -m ps.launch`, where `kvstore='dist_sync'` must land on ps, and
on MXNet's own parameter server for the side-by-side.

    python plain_gluon.py            # one worker of a dist_sync job
    python plain_gluon.py --local    # the reference: one process, both workers' batches
    ... --own-optimizer              # with an optimizer class defined here (runs pickled on servers)
    ... --wide                       # a 2 MiB weight: several 1 MiB chunks per pushpull
    ... --update-on-worker           # Trainer(update_on_kvstore=False): the optimizer runs on the workers
"""
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS, BATCH, WORKERS = 10, 8, 2


IN, HIDDEN = (1024, 512) if "--wide" in sys.argv else (10, 16)


def batch(rank, step):
    rng = np.random.RandomState(100 * step + rank)
    return rng.uniform(-1, 1, (BATCH, IN)).astype(np.float32), rng.uniform(-1, 1, (BATCH, 3)).astype(np.float32)


class ScaledSGD(mx.optimizer.Optimizer):
    """The script's own optimizer (ps has no numpy version): plain SGD with the step scaled."""

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        self._update_count(index)
        weight[:] -= 0.7 * self._get_lr(index) * (grad * self.rescale_grad + self._get_wd(index) * weight)


def main():
    local = "--local" in sys.argv
    kv = mx.kv.create("local" if local else "dist_sync")
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=IN), gluon.nn.Dense(3, in_units=HIDDEN))
    net.initialize(mx.init.Xavier(rnd_type="uniform", magnitude=1.0))
    for i, p in enumerate(net.collect_params().values()):      # the same start on every worker
        p.set_data(mx.nd.array(np.random.RandomState(i).uniform(-0.3, 0.3, p.shape) / np.sqrt(IN / 10)))
    if "--own-optimizer" in sys.argv:
        optimizer = ScaledSGD(learning_rate=0.05, wd=0.05)
        first, second = list(net.collect_params().values())[:2]
        first.wd_mult, second.lr_mult = 0.0, 3.0    # the Trainer hands these to it by index
    else:
        optimizer = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9)
    trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=kv,
                            update_on_kvstore=False if "--update-on-worker" in sys.argv else None)
    loss_fn = gluon.loss.L2Loss()
    ranks = range(WORKERS) if local else [kv.rank]
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in ranks))
        x, y = mx.nd.array(np.concatenate(xs)), mx.nd.array(np.concatenate(ys))
        with autograd.record():
            loss = loss_fn(net(x), y).sum()
        loss.backward()
        trainer.step(BATCH)                 # sum over every worker's samples, / the per-worker batch
    weights = {name: p.data().asnumpy().ravel().tolist() for name, p in net.collect_params().items()}
    print("RESULT " + json.dumps({"kvstore": f"{type(trainer._kvstore).__module__}.{type(trainer._kvstore).__name__}",
                                  "rank": 0 if local else kv.rank, "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
