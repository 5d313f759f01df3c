"""A dist_sync job in numpy: each worker pushes ones*(rank+1); everyone pulls the sum.

Start it by hand (see README) or with `python -m ps.launch -n 2 -s 2 --launcher local
python examples/numpy_sync.py`. Prints one line per worker and exits non-zero if wrong.
"""
import sys

import numpy as np

import ps

with ps.KVStore("dist_sync") as kv:
    kv.init(3, np.ones((2, 3), np.float32))
    big = np.zeros(2_000_000, np.float32)          # above the bound: sharded over all servers
    kv.init(99, big)
    expected = sum(r + 1 for r in range(kv.num_workers))
    for step in range(3):
        kv.push(3, np.ones((2, 3), np.float32) * (kv.rank + 1))
        small = kv.pull(3)
        grad = np.arange(big.size, dtype=np.float32) * (kv.rank + 1)
        out = kv.pushpull(99, grad)
    ok = np.all(small == expected) and np.array_equal(out, np.arange(big.size, dtype=np.float32) * expected)
    print(f"worker {kv.rank}/{kv.num_workers}: key 3 = {small[0, 0]:g} (expected {expected}), "
          f"sharded key ok = {ok}", flush=True)
sys.exit(0 if ok else 1)
