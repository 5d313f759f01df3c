"""Soak: W workers x S servers x N sync rounds with PS_RESEND and random message loss.

Checks every pulled value exactly and samples the RSS of every process (scheduler, servers,
workers: a leak on the client side shows in the workers); prints a JSON summary and fails on a
wrong value or on a process that grew by 10 % or more.

    python -m ps.bench.soak --workers 4 --servers 2 --rounds 2000 --drop 10
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil

from launcher.process import start_group, stop_group
from ps.netutil import free_port

SMALL, BIG = (2, 3), 300_000     # the big key is sharded over every server (bound 1000)


def worker(rounds: int) -> None:
    import ps
    with ps.KVStore("dist_sync") as kv:
        kv.init(["small", "big"], [np.zeros(SMALL, np.float32), np.zeros(BIG, np.float32)])
        k = kv.num_workers
        tri = k * (k + 1) // 2
        base = np.arange(BIG, dtype=np.float32)
        bad, started = 0, time.time()
        for i in range(rounds):
            small = kv.pushpull("small", np.full(SMALL, (kv.rank + 1) * (i % 100 + 1), np.float32))
            big = kv.pushpull("big", base * (kv.rank + 1) + (i % 7))
            bad += not np.all(small == (i % 100 + 1) * tri)
            bad += not np.array_equal(big, base * tri + (i % 7) * k)
        stats = kv.transport_stats()
        print(json.dumps({"rank": kv.rank, "bad": bad, "seconds": time.time() - started,
                          **stats}), flush=True)


def rss_kb(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.Error:
        return 0


def rss_window(samples: list[tuple[float, dict[str, list[int]]]], role: str) -> tuple[list[int], list[int]]:
    """A role's RSS per process 10 s in (after start-up and the first rounds' buffers) and
    at its last sample in which every one of them was still alive (0: exited)."""
    alive = [(t, s[role]) for t, s in samples if all(s[role])]
    if not alive:
        return [], []
    early = next((s for t, s in alive if t >= 10), alive[0][1])
    return early, alive[-1][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--drop", type=float, default=10.0, help="PS_DROP_MSG percent")
    ap.add_argument("--resend-timeout", type=int, default=50, help="PS_RESEND_TIMEOUT ms")
    ap.add_argument("--worker-mode", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_mode:
        worker(args.rounds)
        return 0
    port = free_port()
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_SERVER": str(args.servers), "DMLC_NUM_WORKER": str(args.workers),
           "PS_RESEND": "1", "PS_DROP_MSG": str(args.drop), "PS_RESEND_TIMEOUT": str(args.resend_timeout),
           "MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
    procs = [start_group([sys.executable, "-m", "ps"], {**env, "DMLC_ROLE": "scheduler"})]
    servers = [start_group([sys.executable, "-m", "ps"], {**env, "DMLC_ROLE": "server"})
               for _ in range(args.servers)]
    workers = [start_group([sys.executable, "-m", "ps.bench.soak", "--worker-mode", "--rounds", str(args.rounds)],
                           {**env, "DMLC_ROLE": "worker"}, stdout=subprocess.PIPE, text=True)
               for _ in range(args.workers)]
    procs += servers + workers
    roles = {"scheduler": procs[:1], "server": servers, "worker": workers}
    samples: list[tuple[float, dict[str, list[int]]]] = []
    started = time.time()
    try:
        while any(w.poll() is None for w in workers):
            samples.append((time.time() - started, {role: [rss_kb(p.pid) for p in members] for role, members in roles.items()}))
            time.sleep(1.0)
            if time.time() - started > 3600:
                raise TimeoutError("soak did not finish within an hour")
        results = [json.loads(w.stdout.read().strip().splitlines()[-1]) for w in workers]
    finally:
        for p in procs:
            stop_group(p, grace=0, sig=signal.SIGKILL)
    summary = {"workers": args.workers, "servers": args.servers, "rounds": args.rounds, "drop_pct": args.drop,
               "seconds": round(time.time() - started, 1), "bad_values": sum(r["bad"] for r in results),
               "drops_injected_on_workers": sum(r["dropped"] for r in results),
               "duplicates_dropped_by_workers": sum(r.get("duplicates", 0) for r in results),
               "resent_by_workers": sum(r.get("resent", 0) for r in results)}
    growth: list[float] = []
    for role in roles:
        early, late = rss_window(samples, role)
        grew = [round((b - a) / a * 100, 1) if a else 0.0 for a, b in zip(early, late)]
        summary.update({f"{role}_rss_kb_at_10s": early, f"{role}_rss_kb_at_end": late, f"{role}_rss_growth_pct": grew})
        growth += grew
    print(json.dumps(summary, indent=1))
    ok = summary["bad_values"] == 0 and all(g < 10 for g in growth)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
