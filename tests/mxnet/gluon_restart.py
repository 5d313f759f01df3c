"""An ordinary Gluon training loop (no ps import, no restart logic) in which worker 0 kills
processes of its own job: tests/mxnet/test_restart.py. Data depend on (step, rank) only.
Two networks with a Trainer each on kvstore='dist_sync' (SGD and Adam, as a GAN has): the
second store's keys and optimizer live in their own namespace on the servers, and survive
the kills too. With --module, an MXNet Module instead (SGD with momentum on the servers,
kvstore=kv): it pushes gradients and pulls weights apart, where Gluon's Trainer pushpulls.

    python gluon_restart.py STEPS OUT_DIR [--module] [ROLE:RANK:STEP ...]
"""
import os
import signal
import sys

import mxnet as mx
import numpy as np
import psutil
from mxnet import autograd, gluon, nd

steps, out = int(sys.argv[1]), sys.argv[2]
module = "--module" in sys.argv[3:]
kills = {int(s): (role, rank) for role, rank, s in (k.split(":") for k in sys.argv[3:] if k != "--module")}

kv = mx.kv.create("dist_sync")
mx.random.seed(1)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(4))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                        kvstore="dist_sync")
net2 = gluon.nn.HybridSequential()
net2.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(4))
net2.initialize(mx.init.Xavier(), ctx=mx.cpu())
trainer2 = gluon.Trainer(net2.collect_params(), "adam", {"learning_rate": 0.01}, kvstore="dist_sync")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def batch(step, rank):
    rng = np.random.RandomState(step * 10 + rank)
    x = rng.randn(16, 8).astype(np.float32)
    return nd.array(x), nd.array((x[:, 0] > 0) + 2.0 * (x[:, 1] > 0))


def kill(role, rank, step):
    port = os.environ["DMLC_PS_ROOT_PORT"]
    for proc in psutil.process_iter():
        try:
            env, name = proc.environ(), proc.name()
        except (psutil.Error, OSError):
            continue
        # the node's Python process only (under ssh its watchdog's `cat` has its environment too)
        if env.get("DMLC_ROLE") == role and env.get("DMLC_RANK") == rank and env.get("DMLC_PS_ROOT_PORT") == port \
                and name.startswith("python"):
            print(f"KILL {role} {rank} at step {step}", flush=True)
            proc.send_signal(signal.SIGKILL)


if kv.restarted:      # re-run from step 0: Gluon's Trainer fetches the weights only at its first step
    print(f"RESTARTED rank {kv.rank} round {kv.round}", flush=True)


def train_module():
    body = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=32, name="fc1")
    body = mx.sym.FullyConnected(mx.sym.Activation(body, act_type="relu"), num_hidden=4, name="fc2")
    mod = mx.mod.Module(mx.sym.SoftmaxOutput(body, name="softmax"))
    mod.bind(data_shapes=[("data", (16, 8))], label_shapes=[("softmax_label", (16,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kv, optimizer="sgd",
                       optimizer_params={"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4})
    for step in range(steps):
        x, y = batch(step, kv.rank)
        mod.forward_backward(mx.io.DataBatch([x], [y]))
        mod.update()
        if kv.rank == 0 and step in kills:
            nd.waitall()
            kill(*kills[step], step)
    nd.waitall()
    return {k: v.asnumpy() for k, v in mod.get_params()[0].items()}


if module:
    np.savez(os.path.join(out, f"w{kv.rank}.npz"), **train_module())
    print(f"DONE rank {kv.rank}", flush=True)
    sys.exit(0)
for step in range(steps):
    x, y = batch(step, kv.rank)
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(16)
    with autograd.record():
        loss2 = loss_fn(net2(x), y)
    loss2.backward()
    trainer2.step(16)
    if kv.rank == 0 and step in kills:
        nd.waitall()
        kill(*kills[step], step)
nd.waitall()
weights = {k: v.data().asnumpy() for params in (net.collect_params(), net2.collect_params()) for k, v in params.items()}
np.savez(os.path.join(out, f"w{kv.rank}.npz"), **weights)
print(f"DONE rank {kv.rank}", flush=True)
