"""A ps.torch.ServerOptimizer script (test_torch.py): PyTorch's optimizer on the servers.

    python server_worker.py sgd|adam sync|async [--local [--one]] [--steps N]
prints RESULT with the weights and the losses; --local is one process with torch.optim on
both workers' batches.
"""
import json
import sys

import torch

import ps.torch as hvd

BATCH, WORKERS = 8, 2


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 10, generator=g)
    return x, x @ torch.linspace(-1, 1, 30, dtype=torch.float32).view(10, 3)


def main():
    rule, mode, local = sys.argv[1], sys.argv[2], "--local" in sys.argv
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 15
    hvd.init(kvstore="dist_async" if mode == "async" else "dist_sync")
    torch.manual_seed(7 + hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if local:
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if rule == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    opt = hvd.ServerOptimizer(opt, named_parameters=model.named_parameters())
    ranks = ([0] if "--one" in sys.argv else range(WORKERS)) if local else [hvd.rank()]
    held_x, held_y = batch(99, 999)                 # a fixed batch nobody trains on
    held_x, held_y = torch.cat([held_x] * 8), torch.cat([held_y] * 8)

    def held_out():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(held_x), held_y).item()
    before = held_out()
    losses = []
    for step in range(steps):
        xs, ys = zip(*(batch(r, step) for r in ranks))
        x, y = torch.cat(xs), torch.cat(ys)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("RESULT " + json.dumps({"rank": hvd.rank(), "losses": losses, "held_out": [before, held_out()],
                                  "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()}}),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
