"""A Horovod-style PyTorch script on ps.torch (test_torch.py runs it under the launcher,
and alone with --local as the one-process reference on both workers' batches).

    python torch_worker.py sgd|adam [--local] [--fp16] [--predivide] [--then sgd|adam [--fp16] ...]
    python torch_worker.py mismatch          # rank 1 builds a different layer: both must fail

``--then``: another model trained after the first in the same job (its parameters' names
start with "1."), a RESULT line each.
"""
import json
import sys
import time

import torch

import ps.torch as hvd

STEPS, BATCH, WORKERS = 15, 8, 2


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 10, generator=g), torch.randn(BATCH, 3, generator=g)


def main():
    local = "--local" in sys.argv
    hvd.init()
    args, configs = [a for a in sys.argv[1:] if a != "--local"], []
    while "--then" in args:
        cut = args.index("--then")
        configs.append(args[:cut])
        args = args[cut + 1:]
    for index, config in enumerate(configs + [args]):
        train(config[0], config[1:], local, index)
    hvd.shutdown()


def train(mode, flags, local, index):
    tag = f"{index}." if index else ""               # the keys of a model after the first
    torch.manual_seed(hvd.rank() + 7)                 # different on purpose: broadcast fixes it
    width = 17 if mode == "mismatch" and hvd.rank() == 1 else 16
    model = torch.nn.Sequential(torch.nn.Linear(10, width), torch.nn.Tanh(), torch.nn.Linear(width, 3))
    if local:
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if mode == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    compression = hvd.Compression.fp16 if "--fp16" in flags else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=[(tag + n, p) for n, p in model.named_parameters()],
                                   compression=compression,
                                   gradient_predivide_factor=4.0 if "--predivide" in flags else 1.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ranks = range(WORKERS) if local else [hvd.rank()]
    overlap = []
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in ranks))
        x, y = torch.cat(xs), torch.cat(ys)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        done = time.perf_counter()
        # this step's sends (opt.timeline keeps one step's): the first left during backward()
        overlap.append(opt.timeline[0][1] < done and len(opt.timeline) == 4)
        opt.step()
        mean_loss = hvd.allreduce(loss.detach()).item()     # unnamed, every step: one key, reused
    print("RESULT " + json.dumps({"mean_loss": mean_loss, "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                                  "local_size": hvd.local_size(), "overlap": all(overlap), "config": index,
                                  "first_out": opt.timeline[0][0],
                                  "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()}}),
          flush=True)


if __name__ == "__main__":
    main()
