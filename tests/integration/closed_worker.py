"""A dist_sync worker of test_recovery.py: worker 1 runs 2 steps and closes its store; worker
0 then SIGKILLs server 1 (key 3 lives there) and pushes a third step. Run under
``--max-restarts``: the server's restart must know that worker 1 closed, as its dead self
did, so the push fails naming it instead of waiting for it for ever.

    python closed_worker.py MARKER_FILE
"""
import os
import signal
import sys
import time

import numpy as np

import ps
from recovery_worker import find

MARKER = sys.argv[1]

kv = ps.KVStore("dist_sync")
kv.init(3, np.zeros(4, np.float32))
for step in range(2 if kv.rank == 1 else 3):
    if kv.rank == 0 and step == 2:
        deadline = time.monotonic() + 30
        while not os.path.exists(MARKER):       # worker 1 has closed its store
            if time.monotonic() > deadline:
                sys.exit("worker 1 did not close its store within 30 s")
            time.sleep(0.05)
        find("server", 1).send_signal(signal.SIGKILL)
        print("KILLED server 1", flush=True)
    try:
        got = kv.pushpull(3, np.ones(4, np.float32))
    except ps.PeerLostError as exc:
        print(f"REFUSED step {step}: {exc}", flush=True)
        break
    print(f"STEP {step} {got.tolist()}", flush=True)
kv.close()
if kv.rank == 1:
    open(MARKER, "w").close()
