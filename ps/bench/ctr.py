"""Criteo-shaped click data with a planted teacher, and the DLRM-style model that learns it
(``python -m ps.bench.embedding``). No download: a seeded generator.

Each sample has 26 categorical features (ids Zipf-distributed with exponent ``ALPHA``, folded
into ``rows // 26`` ids per feature; the model sees them as 64-bit hashes) and 13 dense ones.
Its click comes from a hidden teacher: a logit that sums one effect per (feature, id), a
linear term of the dense features and a bias. Since the teacher's click probability of every
sample is known, so is the best any model can do on held-out data (the teacher's own log-loss
and AUC): quality is measured against that, not against a guess.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..embed import Init, initial_rows
from ..embed.hashing import mix64, name_seed

SPARSE, DENSE, DIM, ALPHA = 26, 13, 16, 1.05
EFFECT = 0.4        # std of a teacher's per-id effect
_FEATURE_SEEDS = [name_seed(f"teacher-{f}") for f in range(SPARSE)]
_DENSE_W = np.random.default_rng(12345).normal(0, 0.3, DENSE)
_BIAS = -1.0


class Batch(NamedTuple):
    raw: np.ndarray       # (n, SPARSE) ids in 0 .. per_feature-1: what a torch table is indexed by
    hashed: np.ndarray    # (n, SPARSE) int64 hashes of (feature, id): what a ps table is keyed by
    dense: np.ndarray     # (n, DENSE) float32
    p: np.ndarray         # (n,) the teacher's click probability
    clicks: np.ndarray    # (n,) float32 0/1


def batch(seed: int, n: int, per_feature: int) -> Batch:
    rng = np.random.default_rng(seed)
    raw = (rng.zipf(ALPHA, (n, SPARSE)) - 1) % per_feature
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    logit = dense @ _DENSE_W + _BIAS
    for f in range(SPARSE):
        logit += initial_rows(_FEATURE_SEEDS[f], raw[:, f], 1, Init("normal", EFFECT), np.float64)[:, 0]
    p = 1 / (1 + np.exp(-logit))
    clicks = (rng.random(n) < p).astype(np.float32)
    salted = raw.astype(np.uint64) + (np.arange(SPARSE, dtype=np.uint64) << np.uint64(40))
    return Batch(raw, mix64(salted).view(np.int64), dense, p, clicks)


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def auc(score: np.ndarray, y: np.ndarray) -> float:
    """The area under the ROC curve, by ranks (Mann-Whitney; ties share their mean rank)."""
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(score)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def make_model(embed):
    """DLRM-small: the 26 features' rows (``embed``: (n, 26) ids -> (n, 26, DIM)), the dense
    features through a bottom MLP, all concatenated into a top MLP."""
    import torch
    from torch import nn

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = embed
            self.bottom = nn.Sequential(nn.Linear(DENSE, 32), nn.ReLU(), nn.Linear(32, DIM), nn.ReLU())
            self.top = nn.Sequential(nn.Linear(DIM * (SPARSE + 1), 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, ids, dense):
            return self.top(torch.cat([self.embed(ids).flatten(1), self.bottom(dense)], 1)).squeeze(1)

    torch.manual_seed(0)
    return DLRM()


def torch_tables(per_feature: int, sparse: bool):
    """torch's own: one nn.EmbeddingBag per feature, rows uniform in +-0.05."""
    import torch
    from torch import nn

    class Tables(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)        # the same first rows in every job
            self.bags = nn.ModuleList(nn.EmbeddingBag(per_feature, DIM, mode="sum", sparse=sparse)
                                      for _ in range(SPARSE))
            with torch.no_grad():
                for bag in self.bags:
                    bag.weight.uniform_(-0.05, 0.05)

        def forward(self, ids):
            return torch.stack([bag(ids[:, f:f + 1]) for f, bag in enumerate(self.bags)], 1)

    return Tables()
