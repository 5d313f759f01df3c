"""A worker of tests/torch/test_embedding.py's checkpoint test. ``save DIR``: train a table
(Adam, sync) for a few steps on every worker's copy of the same batches, rank 0 saves it,
then every worker takes one more step. ``load DIR``: rank 0 loads the table (onto however many
servers this job has) and takes that same step. Both print the rows before and after it;
rank 0 of ``save`` also exports the table for serving and prints the rows read back from that."""
import json
import sys

import numpy as np
import torch

import ps.torch as hvd
from ps.embed import Rows
from ps.optim import rowwise

IDS = np.array([-(2**63), -7, 0, 3, 2**40, 2**63 - 1] + list(range(100, 140)), np.int64)


def step(emb, seed):
    rng = np.random.default_rng(seed)
    batch = torch.from_numpy(rng.choice(IDS, (8, 3)))
    emb(batch).sum(1).pow(2).mean().backward()      # every worker the same batch: the mean is it


def main():
    mode, path = sys.argv[1], sys.argv[2]
    hvd.init()
    emb = hvd.Embedding(4, name="ckpt", optimizer=rowwise.Adam(lr=0.05))
    if mode == "save":
        for seed in range(5):
            step(emb, seed)
        emb.flush()
        if hvd.rank() == 0:
            emb.save(path)
            emb.export(path + "-serving")
        hvd.barrier()
    else:
        if hvd.rank() == 0:
            emb.load(path)
        hvd.barrier()
    before = emb.table().pull(IDS)
    served = Rows(path + "-serving").lookup(IDS).tolist() if mode == "save" and hvd.rank() == 0 else None
    step(emb, 99)
    emb.flush()
    after = emb.table().pull(IDS)
    print("RESULT " + json.dumps({"rank": hvd.rank(), "before": before.tolist(), "after": after.tolist(),
                                      "served": served}),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
