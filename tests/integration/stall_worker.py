"""A dist_sync worker whose rank 1 stops for a while: inside a sync round (``round``) or
before a barrier (``barrier``), or inside a round while rank 0 begins its pull only after
the server named the stall (``late``); or (``server``) rank 0 freezes server 1 (keys 3 and 5 live there) (SIGSTOP, SIGCONT
after the sleep), so that both wait for replies while no round lacks a push; or (``self``)
rank 0 is stopped itself (SIGSTOP, SIGCONT after the sleep) in its last step, while it waits
for a reply that comes a second after it resumed (rank 1 pushes that late, then waits for
rank 0 at the barrier with a bound of its own). Used by test_stall.py; prints RESULT with
what it pulled."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

import ps
from recovery_worker import find

MODE, SLEEP = sys.argv[1], float(sys.argv[2])

with ps.KVStore("dist_sync") as kv:
    kv.init([3, 5], [np.zeros(4, np.float32), np.zeros(6, np.float32)])
    for step in range(3):
        if MODE in ("round", "late") and kv.rank == 1 and step == 1:
            time.sleep(SLEEP)               # the others have pushed step 1 and wait for us
        if MODE == "server" and kv.rank == 0 and step == 1:
            server = find("server", 1)
            server.send_signal(signal.SIGSTOP)
            print(f"FREEZE server 1 for {SLEEP}s", flush=True)
            threading.Timer(SLEEP, server.send_signal, (signal.SIGCONT,)).start()
        if MODE == "self" and step == 2:
            if kv.rank == 1:
                time.sleep(SLEEP + 1.5)     # rank 0 waits for this push, stopped from 0.5 s to SLEEP + 0.5 s
            else:
                print(f"FREEZE worker 0 for {SLEEP}s", flush=True)
                subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -STOP {os.getpid()}; sleep {SLEEP}; "
                                              f"kill -CONT {os.getpid()}"])
        kv.push([3, 5], [np.ones(4, np.float32), np.ones(6, np.float32)])
        if MODE == "late" and kv.rank == 0 and step == 1:
            time.sleep(3)                   # the pull begins after the server named the stall
        got = kv.pull([3, 5])
    if MODE == "barrier" and kv.rank == 1:
        time.sleep(SLEEP)
    kv.barrier(timeout=60 if MODE == "self" else None)
    print(f"RESULT rank {kv.rank} key3 {got[0].tolist()}", flush=True)
