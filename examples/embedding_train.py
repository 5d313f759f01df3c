"""Train a click model whose embedding tables live on the parameter servers (ps.torch.EmbeddingBag).

    python -m ps.launch -n 2 -s 2 --launcher local python examples/embedding_train.py
    python examples/embedding_train.py                  # alone: the tables live in the process

The data are generated (no download): each sample has 3 categorical features whose ids are
Zipf-distributed 64-bit hashes (any int64 works: there is no vocabulary to size) and 2 dense
features; its click label comes from a hidden "teacher" with its own table per feature. The
tables hold only the ids the workers touched; each step pulls just the batch's distinct ids
and pushes one gradient row per id. The dense layers train through DistributedOptimizer.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import ps.torch as hvd
from ps.embed import Init
from ps.optim import rowwise

FEATURES, DENSE, DIM = 3, 2, 8


def hashed(ids):
    """Ids as a data pipeline hands them over: 64-bit hashes, not 0..N-1."""
    return (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def make_batch(rng, n, teacher):
    ids = np.minimum(rng.zipf(1.2, (n, FEATURES)), 10**6)
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    logit = teacher[ids % len(teacher), np.arange(FEATURES)].sum(1) + dense @ np.array([0.5, -0.5])
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return torch.from_numpy(hashed(ids)), torch.from_numpy(dense), torch.from_numpy(clicks)


class ClickModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = torch.nn.ModuleList(
            hvd.EmbeddingBag(DIM, "sum", name=f"feature{i}", init=Init("uniform", 0.05),
                             optimizer=rowwise.Adagrad(lr=0.1)) for i in range(FEATURES))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FEATURES * DIM + DENSE, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def forward(self, ids, dense):
        # one id per bag: a 2-d input of shape (batch, 1) per feature
        embedded = [table(ids[:, i:i + 1]) for i, table in enumerate(self.tables)]
        return self.mlp(torch.cat([*embedded, dense], 1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=256, help="per worker")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(0)
    teacher = np.random.default_rng(0).normal(0, 1.5, (1000, FEATURES))
    model = ClickModel()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.mlp.parameters(), lr=0.01),
                                         named_parameters=model.mlp.named_parameters())
    hvd.broadcast_parameters(model.mlp.state_dict(), root_rank=0)
    rng = np.random.default_rng(1 + hvd.rank())
    start, losses = time.perf_counter(), []
    for step in range(1, args.steps + 1):
        ids, dense, clicks = make_batch(rng, args.batch_size, teacher)
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(ids, dense), clicks)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if hvd.rank() == 0 and step % 50 == 0:
            print(f"step {step}: log-loss {np.mean(losses[-50:]):.4f} "
                  f"({(time.perf_counter() - start) / step * 1000:.0f} ms/step)", flush=True)
    for table in model.tables:
        table.flush()
    print(f"worker {hvd.rank()}: first 50 steps log-loss {np.mean(losses[:50]):.4f}, "
          f"last 50 {np.mean(losses[-50:]):.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
