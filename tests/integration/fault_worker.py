"""Worker for the fault-injection tests. Prints JSON lines: progress, result or error."""
import json
import os
import random
import socket
import sys
import threading
import time

import numpy as np
import zmq

import ps


def say(**kw):
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def rounds(kv, n, sleep=0.0):
    kv.init(["small", "big"], [np.zeros((2, 3), np.float32), np.zeros(5000, np.float32)])
    bad = 0
    for i in range(n):
        small = kv.pushpull("small", np.full((2, 3), (kv.rank + 1) * (i + 1), np.float32))
        big = kv.pushpull("big", np.arange(5000, dtype=np.float32) * (kv.rank + 1) + i)
        k = kv.num_workers
        bad += not np.all(small == (i + 1) * k * (k + 1) // 2)
        bad += not np.array_equal(big, np.arange(5000, dtype=np.float32) * (k * (k + 1) // 2) + i * k)
        if i == 0:
            say(event="started", rank=kv.rank, pid=os.getpid())
        time.sleep(sleep)
    return bad


def garbage(addresses, stop):
    """Random bytes over raw TCP and random multipart messages over ZeroMQ, until stopped."""
    ctx = zmq.Context()
    rng = random.Random(1)
    sent = 0
    while not stop.is_set():
        for addr in addresses:
            host, port = addr[len("tcp://"):].rsplit(":", 1)
            with socket.socket() as s:
                s.settimeout(1)
                try:
                    s.connect((host, int(port)))
                    s.sendall(rng.randbytes(rng.randint(1, 300)))
                except OSError:
                    pass
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(addr)
            for _ in range(5):
                d.send_multipart([rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))])
            d.close()
            sent += 1
        time.sleep(0.01)
    ctx.term()
    return sent


if __name__ == "__main__":
    scenario = sys.argv[1]
    try:
        with ps.KVStore("dist_sync") as kv:
            if scenario == "drops":
                bad = rounds(kv, int(sys.argv[2]))
                stats = kv.transport_stats()
                say(event="result", rank=kv.rank, bad=bad, dropped=stats.pop("dropped"), stats=stats)
            elif scenario == "long":
                rounds(kv, 100000, sleep=0.01)
            elif scenario == "garbage":
                stop = threading.Event()
                targets = [f"tcp://{kv.config.root_uri}:{kv.config.root_port}"] + \
                    [kv.nodes[s].addr for s in kv.server_ids]
                t = threading.Thread(target=garbage, args=(targets, stop), daemon=True)
                if kv.rank == 0:
                    t.start()
                bad = rounds(kv, 60, sleep=0.02)
                stop.set()
                say(event="result", rank=kv.rank, bad=bad)
    except ps.PSError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc))
        sys.exit(3)
