"""A worker for the process tests: runs one scenario and prints its result as JSON."""
import json
import sys

import numpy as np

import ps


def rounds(kv, optimizer=None):
    kv.init(3, np.ones((2, 3), np.float32))
    if optimizer:
        kv.set_optimizer(optimizer)
    seen = []
    for _ in range(4):
        kv.push(3, np.ones((2, 3), np.float32) * (kv.rank + 1))
        seen.append(round(float(kv.pull(3)[0, 0]), 6))
    return seen


def sharded(kv):
    rng = np.random.default_rng(kv.rank)
    grad = rng.standard_normal(2_500_000).astype(np.float32)
    kv.init("big", np.zeros_like(grad))
    out = kv.pushpull("big", grad)
    expect = sum(np.random.default_rng(r).standard_normal(grad.size).astype(np.float32)
                 for r in range(kv.num_workers))
    return bool(np.array_equal(out, expect))


SCENARIOS = {
    "sync": lambda kv: rounds(kv),
    "sync_sgd": lambda kv: rounds(kv, ps.optim.SGD(learning_rate=0.1)),
    "sharded": sharded,
}

if __name__ == "__main__":
    scenario = sys.argv[1]
    kvtype = sys.argv[2] if len(sys.argv) > 2 else "dist_sync"
    with ps.KVStore(kvtype) as kv:
        result = SCENARIOS[scenario](kv)
        print(json.dumps({"rank": kv.rank, "result": result}), flush=True)
