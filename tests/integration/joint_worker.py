"""A joint process for tests/integration/test_joint.py (DMLC_ROLE=joint, or worker beside
separate servers): trains a few sync rounds through a server-side SGD and prints, as JSON, its
rank, the values it pulled, how it reaches each server, and whether this process holds a
server thread. ``hang`` instead loops pushpulls until the store fails, then prints the error."""
import json
import sys
import threading

import numpy as np

import ps


def main(mode: str) -> None:
    kv = ps.KVStore("dist_sync")
    kv.init(3, np.ones((2, 3), np.float32))
    kv.init(4, np.zeros(2_500_000, np.float32))        # above the big-array bound: on every server
    kv.set_optimizer(ps.optim.SGD(learning_rate=0.1))
    rng = np.random.default_rng(kv.rank)
    seen = []
    for _ in range(3):
        kv.push(3, np.ones((2, 3), np.float32) * (kv.rank + 1))
        big = kv.pushpull(4, rng.standard_normal(2_500_000).astype(np.float32))
        seen.append([round(float(kv.pull(3)[0, 0]), 6), float(big.sum(dtype=np.float64))])
    if mode == "hang":
        print(json.dumps({"rank": kv.rank, "ready": True}), flush=True)
        try:
            while True:
                kv.pushpull(3, np.ones((2, 3), np.float32))
        except ps.PSError as exc:
            print(json.dumps({"rank": kv.rank, "error": str(exc)}), flush=True)
            sys.exit(3)
    servers = sorted(t.name for t in threading.enumerate() if t.name == "ps-joint-server")
    print(json.dumps({"rank": kv.rank, "seen": seen, "links": kv.server_links(), "threads": servers}), flush=True)
    kv.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "train")
