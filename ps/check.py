"""``python -m ps.check``: is this cluster fit to train on? Run it as the job's command,
with the launch line the training will use:

    python -m ps.launch -n 4 -s 4 -H hosts python -m ps.check

Users of distributed kvstores lose days to a slow path they cannot see: the wrong network
interface, a link negotiated down, a shaped or congested route, a machine whose servers
answer late. Every worker measures, against every server, the round trip of a 4-byte pull
and the rate of a large pull, one worker at a time so that each number is that one path's;
then all workers together time ``dist_sync`` pushpull rounds of a model-sized set of keys
(``--mb``), which is what a training step's communication costs on these links. Rank 0
prints the table and names every path much slower than the others of its kind (same host
or across hosts); ``--strict`` makes that exit 1.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from .kvstore import KVStore
from .message import Role

SLOW_RATE = 0.5       # a path is slow below half the median rate of its kind ...
SLOW_RTT = 3.0        # ... or above 3x the median round trip of its kind, plus
RTT_SLACK_MS = 1.0    # 1 ms (a loaded 2-core machine moves sub-millisecond times a lot)
KEY_BASE = 1 << 40    # far from any key a training script of the same job might use


class Found(NamedTuple):
    """What the workers measured, as every worker has it after the gather."""

    table: np.ndarray      # (workers, 2 * servers + 1): round trips ms, rates MB/s, round s
    path_mb: float         # the size of the pull that measured each path's rate
    model_mb: float        # the size of the model the rounds pushed and pulled


class Path(NamedTuple):
    server: int
    server_host: str
    worker: int
    worker_host: str
    rtt_ms: float
    mb_per_s: float
    same_host: bool
    slow: str              # why it is slow, "" if it is not


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ps.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=64.0,
                   help="model size for the pushpull rounds of all workers together, MB (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="timed pushpull rounds, after one untimed (default 3)")
    p.add_argument("--path-mb", type=float, default=4.0,
                   help="size of the pull that measures each server-to-worker path, MB (default 4)")
    p.add_argument("--pings", type=int, default=20, help="4-byte pulls per path for the round trip (default 20)")
    p.add_argument("--json", metavar="FILE", help="rank 0 also writes the results as JSON here")
    p.add_argument("--strict", action="store_true", help="exit 1 if a path is slow")
    args = p.parse_args(argv)
    for name in ("mb", "path_mb"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("rounds", "pings"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def _key_on(server: int, num_servers: int, taken: set[int]) -> int:
    """An int key MXNet's placement rule puts on ``server`` (for arrays below the bound)."""
    k = KEY_BASE
    while k in taken or (k * 9973) % num_servers != server:
        k += 1
    taken.add(k)
    return k


def measure(kv: KVStore, args: argparse.Namespace) -> Found:
    """Every worker runs this; the returned results (all workers') are rank 0's to print."""
    S, W, rank = kv.num_servers, kv.num_workers, kv.rank
    bound = kv.config.bigarray_bound
    path_elems = max(1, min(int(args.path_mb * 2**20 / 4), bound - 1))   # one server holds it whole
    taken: set[int] = set()
    small = [_key_on(s, S, taken) for s in range(S)]
    large = [_key_on(s, S, taken) for s in range(S)]
    n_model = max(1, int(round(args.mb * 2**20 / 4)))
    model_keys = [KEY_BASE - 1 - i for i in range(max(1, -(-n_model // 2**20)))]     # 4 MB keys, split
    sizes = [2**20] * (len(model_keys) - 1) + [n_model - 2**20 * (len(model_keys) - 1)]
    gather_key = KEY_BASE - 1 - len(model_keys)
    row = np.zeros(2 * S + 1)
    kv.init(small + large + model_keys + [gather_key],
            [np.zeros(1, np.float32)] * S + [np.zeros(path_elems, np.float32)] * S
            + [np.zeros(n, np.float32) for n in sizes] + [np.zeros((W, row.size))])
    for s, k in enumerate(small + large):
        placed = kv.key_info(k).slices
        if len(placed) != 1 or placed[0].server != s % S:
            raise RuntimeError(f"key {k} was meant for server {s % S} alone, but is placed as {placed}")

    for s, k in enumerate(small):                      # round trips: all workers at once (tiny)
        out = np.empty(1, np.float32)
        times = []
        for _ in range(args.pings + 2):
            t = time.perf_counter()
            kv.pull(k, out=out)
            times.append(time.perf_counter() - t)
        row[s] = statistics.median(times[2:]) * 1e3
    for turn in range(W):                              # rates: one worker at a time
        kv.barrier()
        if turn != rank:
            continue
        out = np.empty(path_elems, np.float32)
        for s, k in enumerate(large):
            kv.pull(k, out=out)                        # connection and buffers warm
            best = min(_timed(lambda: kv.pull(k, out=out)) for _ in range(3))
            row[S + s] = path_elems * 4 / 2**20 / best
    kv.barrier()
    grads = [np.ones(n, np.float32) for n in sizes]
    outs = [np.empty(n, np.float32) for n in sizes]
    times = []
    for i in range(args.rounds + 1):
        kv.barrier()
        t = time.perf_counter()
        kv.pushpull(model_keys, grads, out=outs)
        if i:
            times.append(time.perf_counter() - t)
    row[2 * S] = statistics.median(times)
    mine = np.zeros((W, row.size))
    mine[rank] = row
    table = kv.pushpull(gather_key, mine)              # no optimizer: the servers sum the rows
    return Found(table, path_elems * 4 / 2**20, n_model * 4 / 2**20)


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def paths(kv: KVStore, table: np.ndarray) -> list[Path]:
    """Every (server, worker) path with its numbers, the slow ones named."""
    S, W = kv.num_servers, kv.num_workers
    hosts = {(n.role, n.rank): n.host for n in kv.nodes.values()}
    rows = []
    for s in range(S):
        for w in range(W):
            sh, wh = hosts.get((Role.SERVER, s), "?"), hosts.get((Role.WORKER, w), "?")
            rows.append(Path(s, sh, w, wh, float(table[w, s]), float(table[w, S + s]), sh == wh, ""))
    medians = {}                      # same host or not -> (median rate, median round trip)
    for same in {p.same_host for p in rows}:
        kind = [q for q in rows if q.same_host == same]
        medians[same] = (statistics.median(q.mb_per_s for q in kind), statistics.median(q.rtt_ms for q in kind))
    named = []
    for p in rows:
        rate, rtt = medians[p.same_host]
        why = []
        if p.mb_per_s < SLOW_RATE * rate:
            why.append(f"{p.mb_per_s:.1f} MB/s against a median of {rate:.1f}")
        if p.rtt_ms > SLOW_RTT * rtt + RTT_SLACK_MS:
            why.append(f"round trip {p.rtt_ms:.2f} ms against a median of {rtt:.2f}")
        named.append(p._replace(slow="; ".join(why)))
    return named


def report(kv: KVStore, found: Found, args: argparse.Namespace) -> tuple[str, list[Path]]:
    S, W = kv.num_servers, kv.num_workers
    table = found.table
    rows = paths(kv, table)
    lines = [f"ps cluster check: {W} workers, {S} servers ({kv.type}); round trip of a 4-byte pull and "
             f"rate of a {found.path_mb:.1f} MB pull, per server -> worker path:"]
    lines.append("server (host)          worker (host)          round trip ms    MB/s   ")
    for p in rows:
        lines.append(f"{p.server:<4}{p.server_host:<19}{p.worker:<4}{p.worker_host:<19}"
                     f"{p.rtt_ms:>13.3f}{p.mb_per_s:>9.1f}   {'SLOW: ' + p.slow if p.slow else ''}".rstrip())
    rounds = table[:, 2 * S]
    slowest = int(np.argmax(rounds))
    mb = found.model_mb
    lines.append(f"dist_sync pushpull of {mb:.0f} MB by every worker at once (keys of up to 4 MB, "
                 f"split over the servers): {rounds.max():.3f} s per round (worker {slowest}'s, median of {args.rounds}; "
                 f"fastest worker {rounds.min():.3f} s), {mb / rounds.max():.0f} MB/s per worker each way")
    slow = [p for p in rows if p.slow]
    if slow:
        lines.append(f"{len(slow)} slow path(s): " + ", ".join(
            f"server {p.server} ({p.server_host}) -> worker {p.worker} ({p.worker_host})" for p in slow)
            + ". Check those hosts' interfaces (DMLC_INTERFACE, PS_VERBOSE=1 prints what each node "
              "announced), link speed and load.")
    else:
        lines.append("no slow path")
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with KVStore("dist_sync") as kv:
        found = measure(kv, args)
        if kv.rank != 0:
            return 0
        text, rows = report(kv, found, args)
        print(text, flush=True)
        if args.json:
            rounds = found.table[:, 2 * kv.num_servers]
            with open(args.json, "w") as f:
                json.dump({"workers": kv.num_workers, "servers": kv.num_servers, "path_mb": found.path_mb,
                           "model_mb": found.model_mb, "round_s": [float(r) for r in rounds],
                           "paths": [p._asdict() for p in rows]}, f, indent=1)
        return 1 if args.strict and any(p.slow for p in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
