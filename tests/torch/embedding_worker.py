"""A worker of tests/torch/test_embedding.py: trains ps.torch.Embedding and EmbeddingBag
tables (sync) on its half of each batch, then compares their rows with one process that
trains torch's own sparse nn.Embedding/nn.EmbeddingBag on the whole batch, and tries bad input;
then trains a model of tables eagerly and torch.compile'd (embedding_compile_worker.py).
Prints ``RESULT {json}``."""
import json
import sys
import time

import numpy as np
import torch
from embedding_compile_worker import compiled_run  # beside this script (sys.path[0])

import ps.torch as hvd
from ps.embed import Init, initial_rows, rowwise
from ps.embed.hashing import name_seed

DIM, STEPS, BATCH, BAG = 8, 6, 12, 3
# negative, huge, the int64 extremes, and ids that first appear late (the vocabulary grows)
VOCAB = np.array([0, 1, 7, -5, 2**62, -(2**63), 2**63 - 1, 123456789012345, 42, -42, 99, 1000003], np.int64)


def batches(step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole batch of a step (the same on every rank): BATCH bags of up to BAG ids, some
    empty, some with an id twice; targets."""
    rng = np.random.default_rng(100 + step)
    known = VOCAB[:6 + step]
    sizes = rng.integers(0, BAG + 1, BATCH)
    sizes[step % BATCH] = 0                                     # an empty bag every step
    ids = rng.choice(known, sizes.sum())
    if len(ids) > 1:
        ids[1] = ids[0]                                         # a duplicate within the batch
    return ids, sizes, rng.normal(size=BATCH).astype(np.float32)


def bag_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1, 1, DIM)
    return ((out * weights).sum(1) - y).pow(2).mean()


def offsets_of(sizes: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64))


def half(rank: int, size: int, ids, sizes, y):
    """This rank's bags of the batch."""
    per = BATCH // size
    starts = np.r_[0, np.cumsum(sizes)]
    lo, hi = rank * per, (rank + 1) * per
    return ids[starts[lo]:starts[hi]], sizes[lo:hi], y[lo:hi]


def train_ps(make, rank, size):
    emb = make()
    for step in range(STEPS):
        ids, sizes, y = half(rank, size, *batches(step))
        out = emb(torch.from_numpy(ids), offsets_of(sizes))
        bag_loss(out, torch.from_numpy(y)).backward()
    emb.flush()
    return emb.table().pull(VOCAB)


def train_torch(name, optimizer, mode):
    """One process, the whole batch: torch's sparse EmbeddingBag, rows first set as ps makes them."""
    bag = torch.nn.EmbeddingBag(len(VOCAB), DIM, mode=mode, sparse=True)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(initial_rows(name_seed(name), VOCAB, DIM, Init(), np.float32)))
    opt = optimizer(bag.parameters())
    index = {int(v): i for i, v in enumerate(VOCAB)}
    for step in range(STEPS):
        ids, sizes, y = batches(step)
        opt.zero_grad()
        local = torch.tensor([index[int(i)] for i in ids], dtype=torch.int64)
        bag_loss(bag(local, offsets_of(sizes)), torch.from_numpy(y)).backward()
        opt.step()
    return bag.weight.detach().numpy()


def refused(fn) -> str:
    try:
        fn()
    except Exception as exc:    # noqa: BLE001 - the message is what is checked
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = {
        "sgd-sum": (lambda: hvd.EmbeddingBag(DIM, "sum", name="sgd-sum", optimizer=rowwise.SGD(lr=0.1)),
                    lambda p: torch.optim.SGD(p, lr=0.1), "sum"),
        "adagrad-mean": (lambda: hvd.EmbeddingBag(DIM, "mean", name="adagrad-mean",
                                                  optimizer=rowwise.Adagrad(lr=0.1, initial_accumulator_value=0.1)),
                         lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.1), "mean"),
        "adam-sum": (lambda: hvd.EmbeddingBag(DIM, "sum", name="adam-sum", optimizer=rowwise.Adam(lr=0.05)),
                     lambda p: torch.optim.SparseAdam(p, lr=0.05), "sum"),
    }
    diffs, moved = {}, {}
    for name, (make, optimizer, mode) in cases.items():
        got = train_ps(make, rank, size)
        want = train_torch(name, optimizer, mode)
        diffs[name] = float(np.abs(got - want).max())
        first = initial_rows(name_seed(name), VOCAB, DIM, Init(), np.float32)
        moved[name] = float(np.abs(got - first).max())
    # Embedding (not a bag): SGD, ids in a 2-d batch
    emb = hvd.Embedding(DIM, name="plain", optimizer=rowwise.SGD(lr=0.5))
    ref = torch.nn.Embedding(len(VOCAB), DIM, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(initial_rows(name_seed("plain"), VOCAB, DIM, Init(), np.float32)))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        grid = rng.integers(0, len(VOCAB), (4, 3))
        mine = grid[rank * 4 // size:(rank + 1) * 4 // size]
        emb(torch.from_numpy(VOCAB[mine])).sum(1).pow(2).sum(1).mean().backward()
        ref_opt.zero_grad()
        ref(torch.from_numpy(grid)).sum(1).pow(2).sum(1).mean().backward()
        ref_opt.step()
    emb.flush()
    diffs["embedding-sgd"] = float(np.abs(emb.table().pull(VOCAB) - ref.weight.detach().numpy()).max())

    # a collection: two tables looked up together, each as its own EmbeddingBag would be
    coll = hvd.EmbeddingBagCollection(["c0", "c1"], DIM, "sum", optimizer=rowwise.SGD(lr=0.2))
    refs = [torch.nn.EmbeddingBag(len(VOCAB), DIM, mode="sum", sparse=True) for _ in range(2)]
    with torch.no_grad():
        for name, bag in zip(["c0", "c1"], refs):
            bag.weight.copy_(torch.from_numpy(initial_rows(name_seed(name), VOCAB, DIM, Init(), np.float32)))
    ref_opt = torch.optim.SGD([b.weight for b in refs], lr=0.2)
    for step in range(STEPS):
        grid = np.random.default_rng(50 + step).integers(0, len(VOCAB), (4, 2))
        mine = grid[rank * 4 // size:(rank + 1) * 4 // size]
        bag_loss(coll(torch.from_numpy(VOCAB[mine])).sum(1), torch.zeros(len(mine))).backward()
        ref_opt.zero_grad()
        both = torch.stack([b(torch.from_numpy(grid[:, t:t + 1])) for t, b in enumerate(refs)], 1)
        bag_loss(both.sum(1), torch.zeros(4)).backward()
        ref_opt.step()
    coll.flush()
    diffs["collection"] = max(float(np.abs(b.table().pull(VOCAB) - r.weight.detach().numpy()).max())
                              for b, r in zip(coll.bags, refs))

    # async: each worker's gradient applied as it is, not averaged
    lone = hvd.Embedding(2, name="async", optimizer=rowwise.SGD(lr=1.0), init=Init("zeros"), consistency="async")
    (lone(torch.tensor([5])).sum() * (rank + 1)).backward()
    lone.flush()
    hvd.barrier()
    diffs["async"] = float(np.abs(lone.table().pull(np.array([5])) + sum(range(1, size + 1))).max())

    # bounded staleness: rank 1 is slow; every push is applied as it is, none lost
    bounded = hvd.Embedding(2, name="ssp", optimizer=rowwise.SGD(lr=1.0), init=Init("zeros"), consistency="ssp:1")
    for _ in range(4):
        if rank == 1:
            time.sleep(0.3)
        out = bounded(torch.tensor([7]))
        bounded.prefetch(torch.tensor([7]))             # the next step's rows, pulled meanwhile
        (out.sum() * (rank + 1)).backward()
    bounded.flush()
    hvd.barrier()
    diffs["ssp"] = float(np.abs(bounded.table().pull(np.array([7])) + 4 * sum(range(1, size + 1))).max())

    # a worker late to a sync round: the servers name it (PS_STALL_WARNING=1 in the test)
    slow = hvd.Embedding(2, name="slow")
    out = slow(torch.tensor([rank]))
    if rank == 1 and size > 1:
        time.sleep(2.5)
    out.sum().backward()
    slow.flush()

    bag = hvd.EmbeddingBag(DIM, "sum", name="bad-input")
    said = {
        "float ids": refused(lambda: bag(torch.tensor([1.0, 2.0]), torch.tensor([0]))),
        "offsets": refused(lambda: bag(torch.tensor([1, 2, 3]), torch.tensor([0, 5]))),
        "dimension": refused(lambda: hvd.EmbeddingBag(DIM + 1, name="sgd-sum")(torch.tensor([[1]]))),
        "prefetch": refused(lambda: bag.prefetch(torch.tensor([1]))),
    }
    # the aot_eager backend: the graph capture and autograd that inductor compiles too
    # (inductor itself is not run here); its own tables, after everything above
    compiled = compiled_run("aot_eager")
    print("RESULT " + json.dumps({"rank": rank, "size": size, "diffs": diffs, "moved": moved, "said": said,
                                  "compile": compiled}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
