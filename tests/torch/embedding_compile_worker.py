"""torch.compile on ps's tables, for tests/torch/embedding_worker.py (which runs it in its
job, alone and on two workers): the same model (an EmbeddingBag and an Embedding on the
servers, or in the process when alone, and a dense layer) trained eagerly and compiled (the
``backend`` given), from equal starting rows (zeros: a row's first value depends on the table's
name, and the two runs need two tables). ``compiled_run`` gives each run's losses, whether the
rows came out equal, and how far they moved; run as a script it prints them."""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

import ps.torch as hvd
from ps.embed import Init
from ps.optim import rowwise


class Model(torch.nn.Module):
    def __init__(self, tag: str):
        super().__init__()
        self.bag = hvd.EmbeddingBag(8, "mean", name=f"bag-{tag}", init=Init("zeros"), optimizer=rowwise.Adagrad(lr=0.5))
        self.one = hvd.Embedding(8, name=f"one-{tag}", init=Init("zeros"), optimizer=rowwise.SGD(lr=0.5))
        self.lin = torch.nn.Linear(16, 1)

    def forward(self, bags: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.cat([self.bag(bags), self.one(ids)], 1)).squeeze(1)


def train(model: torch.nn.Module, steps: int = 15) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(hvd.rank())
    losses = []
    for _ in range(steps):
        bags = torch.from_numpy(rng.integers(0, 50, (32, 3)))
        ids = torch.from_numpy(rng.integers(-20, 20, 32))
        clicks = ((bags[:, 0] + ids) % 2).float()
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(bags, ids), clicks)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compiled_run(backend: str) -> dict:
    """In a job already joined (hvd.init)."""
    torch.manual_seed(0)
    eager = Model("eager")
    torch.manual_seed(0)
    plain = Model("compiled")
    compiled = torch.compile(plain, backend=backend)
    found = {"rank": hvd.rank(), "eager": train(eager), "compiled": train(compiled)}
    eager.bag.flush(), eager.one.flush(), plain.bag.flush(), plain.one.flush()
    probe = torch.arange(-20, 50)
    rows = eager.one(probe)
    found["same_rows"] = bool(torch.equal(rows, plain.one(probe)))
    found["moved"] = float(rows.detach().abs().max())       # from zeros: the table trained at all
    return found


def main():
    hvd.init()
    print("RESULT " + json.dumps(compiled_run(sys.argv[1])), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
