"""An MXNet Module script with an optimizer class of its own, registered by name, that knows
nothing of ps: run by test_autoload.py under `python -m ps.launch`. Module keys the kvstore
by parameter name and names the optimizer's indices (``idx2name``): biases get no weight decay.

    python plain_module.py            # one worker of a dist_sync job
    python plain_module.py --local    # the reference: one process, both workers' batches
"""
import json
import sys

import mxnet as mx
import numpy as np

STEPS, BATCH, WORKERS, IN = 6, 8, 2, 10


@mx.optimizer.register
class DecayedSGD(mx.optimizer.Optimizer):
    """SGD with weight decay, written as a user would (ps has no numpy version of it)."""

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        self._update_count(index)
        weight[:] -= self._get_lr(index) * (grad * self.rescale_grad + self._get_wd(index) * weight)


def main():
    local = "--local" in sys.argv
    kv = mx.kv.create("local" if local else "dist_sync")
    ranks = range(WORKERS) if local else [kv.rank]
    xs, ys = [], []
    for step in range(STEPS):
        for r in ranks:
            rng = np.random.RandomState(100 * step + r)
            xs.append(rng.uniform(-1, 1, (BATCH, IN)))
            ys.append(rng.uniform(-1, 1, (BATCH, 3)))
    batch = BATCH * len(ranks)
    it = mx.io.NDArrayIter(np.concatenate(xs), np.concatenate(ys), batch_size=batch, label_name="lin_label")
    fc1 = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=16, name="fc1")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(mx.sym.Activation(fc1, act_type="relu"),
                                                              num_hidden=3, name="fc2"), name="lin")
    mod = mx.mod.Module(out, context=mx.cpu(), label_names=["lin_label"])
    mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    shapes = {"fc1_weight": (16, IN), "fc1_bias": (16,), "fc2_weight": (3, 16), "fc2_bias": (3,)}
    mod.init_params(arg_params={name: mx.nd.array(np.random.RandomState(i).uniform(-0.3, 0.3, shape))
                                for i, (name, shape) in enumerate(sorted(shapes.items()))})
    mod.init_optimizer(kvstore=kv, optimizer="decayedsgd",
                       optimizer_params={"learning_rate": 0.1, "wd": 0.05})
    for b in it:
        mod.forward_backward(b)
        mod.update()
    args, _ = mod.get_params()
    print("RESULT " + json.dumps({"rank": 0 if local else kv.rank,
                                  "weights": {k: v.asnumpy().ravel().tolist() for k, v in args.items()}}), flush=True)


if __name__ == "__main__":
    main()
