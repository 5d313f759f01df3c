"""Gluon training-step benchmark: the same model and data on ps and on MXNet's own kvstore.

Run by :mod:`ps.bench.worker` in mode ``gluon``. With ``impl == "ps"`` the worker imports
``ps.mxnet`` first, which registers ``dist_sync`` with ``mx.kvstore.KVStoreBase`` so that
``gluon.Trainer(..., kvstore="dist_sync")`` talks to ps; with ``"native"`` the Trainer gets
MXNet's ps-lite. A step is forward + backward + ``trainer.step``, then

* ``sync="loss"`` (default): wait for this step's loss, as a training loop that logs or
  updates a metric does. The step's traffic may then overlap the next step's forward pass
  (both kvstores run it in MXNet's engine); the time of a step is the steady-state interval
  between two losses, and the last step's ``mx.nd.waitall()`` is timed too.
* ``sync="all"``: ``mx.nd.waitall()`` after every step: nothing overlaps across steps.
"""
from __future__ import annotations

import importlib.util
import time
from typing import Any

MODELS = {
    # name: (description, batch size, input shape without the batch)
    "mlp": ("MLP 1536-2048-2048-1024-512-10 (~10.0 M parameters)", 64, (1536,)),
    "conv": ("conv net 3x32x32: conv16-conv32-pool-conv64-pool-fc256-fc10 (~1.1 M parameters)", 32, (3, 32, 32)),
}


def mxnet_missing() -> str | None:
    """Why the Gluon benchmark cannot run here (None when it can): both sides train with MXNet."""
    if importlib.util.find_spec("mxnet") is None:
        return "MXNet is not installed (pip install -e '.[mxnet]')"
    return None


def build(model: str, nn: Any) -> Any:
    net = nn.HybridSequential()
    if model == "mlp":
        for units in (2048, 2048, 1024, 512):
            net.add(nn.Dense(units, activation="relu"))
        net.add(nn.Dense(10))
    elif model == "conv":
        net.add(nn.Conv2D(16, 3, padding=1, activation="relu"),
                nn.Conv2D(32, 3, padding=1, activation="relu"),
                nn.MaxPool2D(2),
                nn.Conv2D(64, 3, padding=1, activation="relu"),
                nn.MaxPool2D(2),
                nn.Flatten(),
                nn.Dense(256, activation="relu"),
                nn.Dense(10))
    else:
        raise ValueError(f"unknown Gluon model {model!r}; use one of {', '.join(MODELS)}")
    return net


class GluonDriver:
    def __init__(self, spec: dict[str, Any]):
        if spec["impl"] == "ps":
            import ps.mxnet  # noqa: F401 - registers dist_sync & co. with MXNet
        import mxnet as mx
        from mxnet import autograd, gluon
        self.mx, self.autograd = mx, autograd
        model = spec["model"]
        _, batch, shape = MODELS[model]
        self.batch = batch
        mx.random.seed(0)
        self.net = build(model, gluon.nn)
        self.net.initialize(mx.init.Xavier())
        self.net.hybridize()
        self.x = mx.nd.random.uniform(shape=(batch, *shape))
        self.y = mx.nd.array([i % 10 for i in range(batch)])
        self.net(self.x).wait_to_read()       # materialize the parameters
        self.params = sum(int(p.data().size) for p in self.net.collect_params().values())
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()
        self.trainer = gluon.Trainer(self.net.collect_params(), "sgd",
                                     {"learning_rate": 0.01, "momentum": 0.9},
                                     kvstore=spec.get("kvtype", "dist_sync"))
        self.step()                            # creates the kvstore and inits every key
        kv = self.trainer._kvstore
        self.rank = getattr(kv, "rank", 0)
        self.kv_type = type(kv).__module__ + "." + type(kv).__name__

    def step(self, sync: str = "all") -> None:
        with self.autograd.record():
            out = self.loss(self.net(self.x), self.y)
        out.backward()
        self.trainer.step(self.batch)
        if sync == "all":
            self.mx.nd.waitall()
        else:
            out.wait_to_read()

    def run(self, steps: int, warmup: int, sync: str = "loss") -> dict[str, Any]:
        if sync not in ("loss", "all"):
            raise ValueError(f"unknown Gluon sync mode {sync!r}; use loss or all")
        for _ in range(warmup):
            self.step()
        times = []
        t0 = time.perf_counter()
        for i in range(steps):
            self.step(sync)
            if i == steps - 1:
                self.mx.nd.waitall()       # the last step's update belongs to the run
            t1 = time.perf_counter()
            times.append((t1 - t0) * 1e3)
            t0 = t1
        return {"times_ms": times, "params": self.params, "kv_type": self.kv_type,
                "rounds_run": steps + warmup}

    def stats(self) -> dict[str, Any]:
        """ps only: bytes each server stores, from the Trainer's store."""
        server_stats = getattr(self.trainer._kvstore, "server_stats", None)
        if server_stats is None:        # native MXNet's store
            return {}
        return {str(sid): {"bytes": r["bytes"], "keys": r["keys"], "port": r["port"]}
                for sid, r in server_stats().items()}

    def close(self) -> None:
        self.mx.nd.waitall()
        kv = self.trainer._kvstore
        close = getattr(kv, "close", None)
        if callable(close):
            close()
        del self.trainer
