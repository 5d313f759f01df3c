"""Capacity benchmark: one embedding table many times bigger than a worker may be, trained by
workers that limit their own address space (RLIMIT_AS) before they import torch.

Each worker first makes its share of the table's rows (pulls of id ranges, no gradient: the
servers make a row on first touch), then trains a small model on random ids for ``--steps``
steps. Reported: the table's bytes against the limit, each worker's peak RSS and address
space, the servers' peak RSS, and the time to fill and to train.

    python -m ps.bench.capacity                        # 2.5e7 rows of dim 128 (12.8 GB), S4, 1200 MB
    python -m ps.bench.capacity --rows 200000 --servers 2   # quick

A worker over its limit fails with numpy's or torch's MemoryError, and the job with it. The
servers hold the table: about 1.15x its bytes in RSS once it is made (ids, the id index, use
counts), more at the moment a table grows (its old and new arrays).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from ps.netutil import free_port

from .cluster import base_env, torch_job
from .measure import proc_status

FILL = 1 << 16          # ids per pull while filling (a 32 MB reply at dim 128)


def worker(args: argparse.Namespace) -> None:
    limit = args.worker_limit_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))   # before torch maps anything
    import numpy as np
    import torch
    import torch.nn.functional as F

    import ps.torch as hvd
    from ps.embed import Init
    from ps.optim import rowwise

    hvd.init()
    torch.set_num_threads(1)
    emb = hvd.EmbeddingBag(args.dim, "sum", name="capacity", init=Init("zeros"), optimizer=rowwise.SGD(lr=0.05))
    mlp = torch.nn.Sequential(torch.nn.Linear(args.dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(mlp.parameters(), lr=0.01), named_parameters=mlp.named_parameters())
    hvd.broadcast_parameters(mlp.state_dict(), root_rank=0)
    start = time.perf_counter()
    for c in range(hvd.rank(), (args.rows + FILL - 1) // FILL, hvd.size()):
        with torch.no_grad():
            emb(torch.arange(c * FILL, min(args.rows, (c + 1) * FILL)).view(-1, 1))
    filled = time.perf_counter() - start
    rng = np.random.default_rng(hvd.rank())
    start = time.perf_counter()
    for _ in range(args.steps):
        ids = torch.from_numpy(rng.integers(0, args.rows, (args.batch, 8)))
        clicks = torch.from_numpy((ids[:, 0] % 2).numpy().astype(np.float32))
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(mlp(emb(ids)).squeeze(1), clicks).backward()
        opt.step()
    emb.flush()
    import psutil
    result = {"fill_s": filled, "train_s": time.perf_counter() - start,
              "peak_rss": proc_status(os.getpid()).get("VmHWM", 0), "vms": psutil.Process().memory_info().vms}
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


def run(args: argparse.Namespace) -> tuple[list[dict], int]:
    env = base_env({"OMP_NUM_THREADS": "1", "PS_MXNET_AUTOLOAD": "0", "DMLC_PS_ROOT_URI": "127.0.0.1",
                    "DMLC_PS_ROOT_PORT": str(free_port()), "DMLC_NUM_SERVER": str(args.servers),
                    "DMLC_NUM_WORKER": str(args.workers), "PS_CONNECT_TIMEOUT": "120"})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    me = [sys.executable, "-m", "ps.bench.capacity", "--worker", "--rows", str(args.rows), "--dim", str(args.dim),
          "--steps", str(args.steps), "--batch", str(args.batch), "--worker-limit-mb", str(args.worker_limit_mb)]
    return torch_job("capacity", me, env, [{"DMLC_ROLE": "worker"}] * args.workers, args.servers, args.timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=25_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("-w", "--workers", type=int, default=2)
    ap.add_argument("-s", "--servers", type=int, default=4)
    ap.add_argument("--worker-limit-mb", type=int, default=1200, help="each worker's address space (RLIMIT_AS)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    table = args.rows * args.dim * 4
    print(f"one table of {args.rows:.3g} rows x dim {args.dim} (float32, SGD): {table / 1e9:.2f} GB; W{args.workers} "
          f"S{args.servers}; workers limited to {args.worker_limit_mb} MB of address space "
          f"(table / limit = {table / (args.worker_limit_mb << 20):.1f})", flush=True)
    found, servers = run(args)
    print("| worker | fill s | train s | peak RSS MB | address space MB |")
    print("|---|---:|---:|---:|---:|")
    for rank, r in enumerate(found):
        print(f"| {rank} | {r['fill_s']:.0f} | {r['train_s']:.1f} | {r['peak_rss'] / 2**20:.0f} | {r['vms'] / 2**20:.0f} |")
    print(f"servers' peak RSS: {', '.join(f'{p / 2**20:.0f}' for p in servers)} MB "
          f"(sum {sum(servers) / 1e9:.2f} GB for a {table / 1e9:.2f} GB table)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
