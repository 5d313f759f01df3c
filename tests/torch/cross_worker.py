"""DistributedOptimizer(model=...) (the cross-barrier) beside the waiting step(), in one job:
every worker trains two copies of each model from the same start on the same batches, one
per path, with each of torch's per-parameter optimizers and an LR schedule; test_cross_barrier.py
checks the weights are equal, bit for bit. Then the refusals, each caught and printed.

    python cross_worker.py [--variants] [--timeline PATH]

``--timeline``: rank 0 writes Horovod's timeline of the job (a row per key summed).
``--variants``: then, in the same job, both paths again with two backward passes per step and
with bf16 autocast (keys of their own, after everything above).
"""
import json
import sys

import numpy as np
import torch

import ps.torch as hvd
from ps.collective import tensor_key
from ps.keys import balance
from ps.torch import runtime

STEPS, BATCH = 8, 6
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05),
}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(10, 16)
        self.head = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.side = torch.nn.Linear(10, 3)          # used on even steps only: a module the forward skips

    def forward(self, x, step):
        out = self.head(self.first(x))
        return out + self.side(x) if step % 2 == 0 else out


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 10, generator=g), torch.randn(BATCH, 3, generator=g)


VARIANTS = {"p2.": (2, False), "bf16.": (1, True)}     # key prefix: (backward passes per step, autocast)


def train(name, cross, passes, autocast, tag=""):
    torch.manual_seed(3)
    model = Net()
    opt = OPTIMIZERS[name](model.parameters())
    prefix = f"{tag}{name}.{'cross' if cross else 'wait'}."
    opt = hvd.DistributedOptimizer(opt, named_parameters=[(prefix + n, p) for n, p in model.named_parameters()],
                                   backward_passes_per_step=passes, model=model if cross else None)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            x, y = batch(hvd.rank() + 10 * k, step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x, step)
            torch.nn.functional.mse_loss(out.float(), y).backward()
        opt.step()
        sched.step()
        if step == 4:
            with torch.no_grad():
                model(x, step)                       # an evaluation pass between steps
    return {k: v.flatten().tolist() for k, v in model.state_dict().items()}


def refusals():
    said = {}
    model = Net()

    def attempt(what, fn):
        try:
            fn()
            said[what] = "accepted"
        except (ValueError, TypeError, RuntimeError) as exc:
            said[what] = str(exc)
    attempt("lbfgs", lambda: hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()), model=model,
                                                      named_parameters=[("l." + n, p) for n, p in model.named_parameters()]))
    other = torch.nn.Linear(2, 2)
    attempt("foreign", lambda: hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model=model,
                                                        named_parameters=[("f." + n, p) for n, p in other.named_parameters()]))
    attempt("compiled", lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                         model=torch.compile(model),
                                                         named_parameters=[("c." + n, p) for n, p in model.named_parameters()]))

    # a parameter read outside the forward of the module that holds it: named, not silently stale
    lin = torch.nn.Linear(4, 4)
    holder = torch.nn.ModuleDict({"lin": lin})
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), model=holder,
                                   named_parameters=[("s." + n, p) for n, p in lin.named_parameters()])

    def two_steps():
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.linear(torch.ones(2, 4), lin.weight, lin.bias).sum().backward()
            opt.step()
    attempt("stale", two_steps)
    return said


def train_all(passes, autocast, tag=""):
    """Every optimizer, waiting and cross-barrier from the same start: whether the two paths
    ended alike, whether SGD's weights moved at all, and the waiting path's weights."""
    runs = {name: [train(name, cross, passes, autocast, tag) for cross in (False, True)] for name in OPTIMIZERS}
    return {"same": {name: wait == cross for name, (wait, cross) in runs.items()},
            "moved": runs["sgd"][0] != train_start(), "weights": {name: wait for name, (wait, _) in runs.items()}}


def main():
    hvd.init()
    if "--timeline" in sys.argv:
        hvd.start_timeline(sys.argv[sys.argv.index("--timeline") + 1])
    found = train_all(1, False)
    variants = {tag: train_all(passes, autocast, tag)
                for tag, (passes, autocast) in (VARIANTS.items() if "--variants" in sys.argv else ())}
    if "--timeline" in sys.argv:
        hvd.stop_timeline()
    print("RESULT " + json.dumps({"rank": hvd.rank(), **found, "placed": placed("sgd.wait.", "sgd.cross."),
                                  "variants": {tag: {"same": v["same"], "moved": v["moved"]} for tag, v in variants.items()},
                                  "refused": refusals()}), flush=True)
    hvd.shutdown()


def placed(*prefixes):
    """Per optimizer (``prefixes``: the first ones this process made, in the order main() made
    them: sgd, the first of OPTIMIZERS, waiting then cross): the server each of its
    gradient keys lives on, by parameter name, and where ps.keys.balance places that set after
    the sets before it (keys of a key each: with PS_TORCH_FUSION on, some are in buckets)."""
    kv = runtime.store()
    held, found = [0] * kv.num_servers, {}
    for prefix in prefixes:
        names = {n: (tensor_key(f"allreduce.grad.{prefix}{n}", tuple(p.shape), np.float32), p.numel())
                 for n, p in Net().named_parameters()}
        want = balance(list(names.values()), kv.num_servers, kv.config.bigarray_bound, held=held)
        found[prefix] = {"servers": {n: kv.key_info(k).slices[0].server for n, (k, _) in names.items()
                                     if kv.key_info(k) is not None},
                         "want": {n: want[k] for n, (k, _) in names.items() if k in want}}
    return found


def train_start():
    torch.manual_seed(3)
    return {k: v.flatten().tolist() for k, v in Net().state_dict().items()}


if __name__ == "__main__":
    main()
