"""The PyTorch worker of the multi-host benchmark (``--impls ps-torch,ddp``): Horovod-style
training steps on a model with a real model's parameter shapes, compute simulated per layer.

The model is a chain of modules of one parameter each, each one autograd node: its forward
sleeps that layer's share of the forward time, its backward sleeps its share of the backward
time and hands the parameter a gradient. So autograd produces the gradients layer by layer,
last layer first, exactly when a real backward would, and each system sends them the way it
does for a real model: ``ps.torch.DistributedOptimizer`` from a hook per parameter, DDP
(gloo) per bucket (``bucket_cap_mb`` scaled with the model). ``optimizer.step()`` waits for
what is still in flight, as Horovod's does; with ``ps-torch-cross``
(``DistributedOptimizer(model=...)``) each module's forward waits for its own parameter
instead. The sleeps keep the CPUs free for the communication, as with a GPU.

Reports per step the time spent waiting for sums: from the end of ``backward()`` to the end
of ``step()``, plus the forward pass's time beyond its compute, as the run's ``stall``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any


def run(spec: dict[str, Any]) -> None:
    import numpy as np
    import torch
    torch.set_num_threads(1)
    shapes = [tuple(s) for s in spec["shapes"]]
    sizes = [int(np.prod(s)) for s in shapes]
    total, compute = sum(sizes), spec["compute"]
    fwd = [compute / 3 * n / total for n in sizes]
    bwd = [compute * 2 / 3 * n / total for n in sizes]

    class Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, i: int) -> torch.Tensor:
            ctx.i = i
            time.sleep(fwd[i])
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple:
            time.sleep(bwd[ctx.i])
            return grad, torch.full(shapes[ctx.i], 0.001, dtype=torch.float32), None

    class Holder(torch.nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.i, self.weight = i, torch.nn.Parameter(torch.zeros(shapes[i]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Layer.apply(x, self.weight, self.i)

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Holder(i) for i in range(len(shapes)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    model = Chain()
    if spec["impl"] == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=spec.get("bucket_mb", 25.0))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
    else:
        import ps.torch as hvd
        hvd.init()
        rank = hvd.rank()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters(),
                                       model=model if spec["impl"] == "ps-torch-cross" else None)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.zeros(1, requires_grad=True)
    steps, stalls = [], []
    clock = time.monotonic          # the driver's clock too: it reads the links' load over the timed steps
    start = window_start = clock()
    for step in range(spec["warmup"] + spec["steps"]):
        if step == spec["warmup"]:
            print(f"TIMED {rank}", flush=True)
            window_start = start
        opt.zero_grad()
        forward_start = clock()
        out = model(x).sum()
        forward_wait = max(0.0, clock() - forward_start - compute / 3)
        out.backward()
        backward_done = clock()
        opt.step()
        now = clock()
        steps.append(now - start)
        stalls.append(now - backward_done + forward_wait)
        start = now
    timed = slice(spec["warmup"], None)
    print("RESULT " + json.dumps({"rank": rank, "window": [window_start, start],
                                  "median": statistics.median(steps[timed]), "steps": steps[timed],
                                  "stall": statistics.median(stalls[timed]), "first_stall": 0.0}), flush=True)
    if spec["impl"] == "ddp":
        # every rank done with gloo, then leave without tearing it down: gloo's teardown
        # aborted twice in CI ("terminate called without an active exception", SIGABRT) after
        # the result was printed, once even after this barrier. The baseline's numbers are out;
        # nothing of it needs cleaning up.
        torch.distributed.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    else:
        hvd.shutdown()
