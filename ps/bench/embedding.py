"""Embedding benchmark: a click model (ps/bench/ctr.py) trained with its tables held by ps's
servers, against torch's ways of doing it, on this machine.

Modes, each a job of ``-w`` workers (``one``: a single process on the whole batch):

* ``one``: ``nn.EmbeddingBag(sparse=True)``, torch's Adagrad: the quality reference;
* ``ddp``: torch DDP (gloo), every table replicated on every worker (dense gradients);
* ``ps-allgather``: today's ps.torch without ps tables: sparse gradients through
  ``DistributedOptimizer`` (an allgather), tables replicated;
* ``ps-sync``: ``ps.torch.EmbeddingBagCollection``, the tables on ``-s`` servers, sync
  rounds; the dense layers through ``DistributedOptimizer``;
* ``ps-async``, ``ps-ssp``: the tables ``async`` and ``ssp:4``, and the dense layers' Adam on
  the servers too (``ServerOptimizer`` in ``dist_async``), so no worker waits for another
  but for the staleness bound.

With ``--prefetch`` they pull the next batch's rows during backward
(``EmbeddingBagCollection.prefetch``).

``--straggler``: worker 1 takes twice its compute time every step (it sleeps as long as its
step took).

Embeddings train with Adagrad (``--lr``), the dense layers with Adam (1e-3). Reported: samples
per second, held-out log-loss and AUC after the run against the teacher's (the best any model
can reach), the training time until the held-out log-loss came within 1% of the teacher's,
for ps tables the bytes per sample against the floor 2*U*d*4 (U: distinct ids per worker
batch), and peak RSS per worker and server.

    python -m ps.bench.embedding                      # 10^6 rows, W2 S2, 300 steps of 512
    python -m ps.bench.embedding --rows 20000 --steps 20 --modes one,ps-sync   # quick
    sudo python -m ps.bench.embedding --hosts 4 --link 1gbit --modes ddp,ps-sync   # shaped hosts

``--hosts K --link RATE``: each worker (and server) on a network-namespace host of its own
whose link is shaped to RATE both ways (ps/bench/netns.py, as ``python -m ps.bench --hosts``;
root only); ``-w`` and ``-s`` default to K. ``one`` runs outside them. The CPU load column
is this machine's over each job: above 70% the run measured the CPUs, not the links.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from ps.netutil import free_port

from . import ctr
from .cluster import torch_job
from .measure import CPU_LIMIT, load_between, machine_seconds, proc_status

PYTHON = sys.executable
MODES = ("one", "ddp", "ps-allgather", "ps-sync", "ps-async", "ps-ssp")
SSP = "ssp:4"
EVAL_SEED = 10**9


def _tables(mode: str, per_feature: int, lr: float):
    if mode in ("ps-sync", "ps-async", "ps-ssp"):
        import ps.torch as hvd
        from ps.embed import Init
        from ps.optim import rowwise
        return hvd.EmbeddingBagCollection(ctr.SPARSE, ctr.DIM, "sum", prefix="feature", init=Init("uniform", 0.05),
                                          optimizer=rowwise.Adagrad(lr=lr),
                                          consistency=SSP if mode == "ps-ssp" else mode[3:])
    return ctr.torch_tables(per_feature, sparse=mode != "ddp")


def worker(mode: str, args: argparse.Namespace) -> None:
    """One process of a job: train, time each step, evaluate, print RESULT."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    per_feature = args.rows // ctr.SPARSE
    rank, size, hvd = 0, 1, None
    server_side = mode in ("ps-async", "ps-ssp")
    if mode.startswith("ps-"):
        import ps.torch as hvd
        hvd.init(kvstore="dist_async" if server_side else "dist_sync")
        rank, size = hvd.rank(), hvd.size()
    elif mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
    model = ctr.make_model(_tables(mode, per_feature, args.lr))
    dense = [p for n, p in model.named_parameters() if not n.startswith("embed.")]
    sparse = [p for n, p in model.named_parameters() if n.startswith("embed.")]
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizers = [torch.optim.Adam(dense, lr=1e-3)] + ([torch.optim.Adagrad(sparse, lr=args.lr)] if sparse else [])
    if hvd is not None:
        named = dict(model.named_parameters())
        wrap = hvd.ServerOptimizer if server_side else hvd.DistributedOptimizer
        optimizers = [wrap(opt, named_parameters=[(n, p) for n, p in named.items() if any(p is q for q in group)])
                      for opt, group in zip(optimizers, [dense, sparse])]
        if not server_side:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hashed = mode in ("ps-sync", "ps-async", "ps-ssp")
    workers = args.workers
    held_out = ctr.batch(EVAL_SEED, args.eval_samples, per_feature)

    def payload_now() -> int:
        if not hashed:
            return 0
        return sum(b.table().payload_sent + b.table().payload_received for b in model.embed.bags)

    evaluated = 0      # table bytes the evaluations moved (not the training's)

    def evaluate() -> tuple[float, float]:
        nonlocal evaluated
        before = payload_now()
        model.eval()
        with torch.no_grad():
            ids = held_out.hashed if hashed else held_out.raw
            p = torch.sigmoid(model(torch.from_numpy(ids), torch.from_numpy(held_out.dense))).numpy()
        model.train()
        evaluated += payload_now() - before
        return ctr.log_loss(p, held_out.clicks), ctr.auc(p, held_out.clicks)

    times, curve, uniques, trained = [], [], [], 0.0
    prefetch = args.prefetch and server_side

    def data(step: int) -> list[ctr.Batch]:
        return [ctr.batch(step * 1000 + r, args.batch, per_feature) for r in (range(workers) if mode == "one"
                                                                             else [rank])]
    upcoming = data(0)
    for step in range(args.steps):
        parts, upcoming = upcoming, data(step + 1) if step + 1 < args.steps else None
        ids = np.concatenate([b.hashed if hashed else b.raw for b in parts])
        x = torch.from_numpy(np.concatenate([b.dense for b in parts]))
        y = torch.from_numpy(np.concatenate([b.clicks for b in parts]))
        uniques.append(sum(len(np.unique(ids[:, f])) for f in range(ctr.SPARSE)))
        start = time.perf_counter()
        for opt in optimizers:
            opt.zero_grad()
        logits = model(torch.from_numpy(ids), x)
        if prefetch and upcoming is not None:       # the next batch's rows, pulled during backward
            model.embed.prefetch(torch.from_numpy(np.concatenate([b.hashed for b in upcoming])))
        F.binary_cross_entropy_with_logits(logits, y).backward()
        for opt in optimizers:
            opt.step()
        if args.straggler and rank == 1:
            time.sleep(time.perf_counter() - start)
        took = time.perf_counter() - start
        if step >= args.warmup:
            times.append(took)
        trained += took
        if rank == 0 and args.eval_every and (step + 1) % args.eval_every == 0:
            curve.append((trained, *evaluate()))
    payload = payload_now()
    result = {"step_s": times, "samples": len(y), "unique_ids": statistics.mean(uniques), "curve": curve}
    if hashed:
        model.embed.flush()
        result["payload_bytes"] = payload - evaluated
    if rank == 0:
        result["final"] = evaluate()
    result["peak_rss"] = proc_status(os.getpid()).get("VmHWM", 0)
    if mode == "ddp":
        import torch.distributed as dist
        dist.barrier()
    print("RESULT " + json.dumps(result), flush=True)
    if hvd is not None:
        hvd.shutdown()
    elif mode == "ddp":      # destroy_process_group can hang when rank 0's store closes first
        sys.stdout.flush()
        os._exit(0)


class Job(NamedTuple):
    found: list[dict]       # each worker's RESULT
    server_peak: int        # the largest server's peak RSS, bytes
    load: float             # this machine's CPU load over the job, 0..1


def run_job(mode: str, args: argparse.Namespace, hosts: Any = None) -> Job:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PS_MXNET_AUTOLOAD="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    me = [PYTHON, "-m", "ps.bench.embedding", "--worker-mode", mode, "--rows", str(args.rows), "--batch",
          str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "-w", str(args.workers),
          "--lr", str(args.lr),
          "--eval-every", str(args.eval_every), "--eval-samples", str(args.eval_samples)]
    if args.straggler:
        me.append("--straggler")
    if args.prefetch:
        me.append("--prefetch")
    n = 1 if mode == "one" else args.workers
    servers = 0
    if mode.startswith("ps-"):
        servers = args.servers
        env.update(DMLC_PS_ROOT_URI="127.0.0.1" if hosts is None else hosts.ip(0), DMLC_PS_ROOT_PORT=str(free_port()),
                   DMLC_NUM_SERVER=str(args.servers), DMLC_NUM_WORKER=str(n), PS_CONNECT_TIMEOUT="120")
        worker_envs = [{"DMLC_ROLE": "worker"}] * n
    elif mode == "ddp":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n))
        if hosts is not None:
            env.update(MASTER_ADDR=hosts.ip(1), GLOO_SOCKET_IFNAME="eth0")
        worker_envs = [{"RANK": str(r)} for r in range(n)]
    else:
        worker_envs = [{}]
    start = machine_seconds()
    found, peaks = torch_job(mode, me, env, worker_envs, servers, args.timeout, None if mode == "one" else hosts)
    return Job(found, max(peaks, default=0), load_between(start, machine_seconds()))


def report(args: argparse.Namespace, runs: dict[str, list[tuple[list[dict], int]]]) -> None:
    per_feature = args.rows // ctr.SPARSE
    held_out = ctr.batch(EVAL_SEED, args.eval_samples, per_feature)
    best_ll, best_auc = ctr.log_loss(held_out.p, held_out.clicks), ctr.auc(held_out.p, held_out.clicks)
    target = 1.01 * best_ll
    # the one process's final held-out log-loss: a target every mode can reach in the same steps
    ref = statistics.median(job.found[0]["final"][0] for job in runs["one"]) * 1.01 if "one" in runs else None
    where = f", each on a host of its own, links {args.link}, TCP {args.tcp}" if args.hosts else ""
    print(f"\n{ctr.SPARSE} tables of {per_feature} rows (dim {ctr.DIM}, {args.rows:.0e} rows), batch "
          f"{args.batch}/worker, W{args.workers} (ps: S{args.servers}){where}"
          f"{', worker 1 a 2x straggler' if args.straggler else ''}, "
          f"{args.steps} steps, one thread per "
          f"process; median of {args.reps} job(s). Teacher on {args.eval_samples} held-out samples: log-loss "
          f"{best_ll:.4f}, AUC {best_auc:.4f}")
    print("| mode | samples/s | held-out log-loss | AUC | s to 1% of teacher | s to 1% of one process | "
          "bytes/sample (floor) | peak RSS worker / server MB | CPU load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, jobs in runs.items():
        rates, lls, aucs, reach, near, byts, floor, rss_w, rss_s = [], [], [], [], [], [], [], [], []
        for found, server_peak, _ in jobs:
            # the mean step, not the median: under async and ssp a worker runs ahead, then waits
            rates.append(sum(r["samples"] / statistics.mean(r["step_s"]) for r in found))
            first = next(r for r in found if "final" in r)
            lls.append(first["final"][0])
            aucs.append(first["final"][1])
            reach.append(next((t for t, ll, _ in first["curve"] if ll <= target), None))
            if ref is not None:
                near.append(next((t for t, ll, _ in first["curve"] if ll <= ref), None))
            if "payload_bytes" in found[0]:
                byts.append(statistics.mean(r["payload_bytes"] / (args.batch * args.steps) for r in found))
                floor.append(statistics.mean(2 * r["unique_ids"] * ctr.DIM * 4 / args.batch for r in found))
            rss_w.append(max(r["peak_rss"] for r in found) / 2**20)
            rss_s.append(server_peak / 2**20)
        when, when_ref = _when(reach), _when(near) if near else "-"
        traffic = f"{statistics.median(byts):.0f} ({statistics.median(floor):.0f})" if byts else "-"
        server = f"{statistics.median(rss_s):.0f}" if any(rss_s) else "-"
        load = statistics.median(job.load for job in jobs)
        flag = ", **CPU-bound**" if load > CPU_LIMIT else ""
        print(f"| {mode} | {statistics.median(rates):.0f} | {statistics.median(lls):.4f} | "
              f"{statistics.median(aucs):.4f} | {when} | {when_ref} | {traffic} | {statistics.median(rss_w):.0f} / {server} | "
              f"{load:.0%}{flag} |")


def server_rate(rows: int, reps: int = 50) -> None:
    """What one server thread does per second, in process (no network): ``--server-rate``."""
    from ps.embed import TableSpec
    from ps.embed.table import RowTable, sum_rows
    from ps.optim import rowwise
    rng = np.random.default_rng(0)
    batches = [np.unique(ctr.batch(i, 512, rows // ctr.SPARSE).hashed) for i in range(reps)]
    grads = [rng.standard_normal((len(b), ctr.DIM)).astype(np.float32) for b in batches]
    n = sum(len(b) for b in batches)
    print(f"\nOne server thread, dim {ctr.DIM}, a table of {rows:.0e} rows, {n // reps} distinct ids per request "
          f"(a batch of 512 of ps.bench.ctr's data)")
    print("| operation | M rows/s |")
    print("|---|---:|")
    for name, opt in (("SGD", rowwise.SGD(lr=0.1)), ("Adagrad", rowwise.Adagrad(lr=0.1)),
                      ("Adam", rowwise.Adam(lr=0.1))):
        table = RowTable(TableSpec("rate", ctr.DIM, opt))
        table.lookup(np.unique(rng.integers(-2**62, 2**62, rows)))      # the table's size
        start = time.perf_counter()
        for b in batches:
            table.lookup(b)
        made = time.perf_counter() - start
        start = time.perf_counter()
        for b in batches:
            table.lookup(b)
        looked = time.perf_counter() - start
        start = time.perf_counter()
        for b, g in zip(batches, grads):
            table.apply(*sum_rows(b, g))
        applied = time.perf_counter() - start
        if name == "SGD":
            print(f"| making new rows (normal init) | {n / made / 1e6:.2f} |")
            print(f"| lookup of rows that exist | {n / looked / 1e6:.2f} |")
        print(f"| {name} update | {n / applied / 1e6:.2f} |")


def _when(times: list[float | None]) -> str:
    """The median training time to a target, or that some job never reached it."""
    if any(t is None for t in times):
        return "not reached"
    return f"{statistics.median(times):.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10**6, help="rows over all 26 tables")
    ap.add_argument("--batch", type=int, default=512, help="samples per worker and step")
    ap.add_argument("-w", "--workers", type=int, default=None, help="default 2 (--hosts: K)")
    ap.add_argument("-s", "--servers", type=int, default=None, help="default 2 (--hosts: K)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (rank 0)")
    ap.add_argument("--eval-samples", type=int, default=20000)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--reps", type=int, default=1, help="jobs per mode (alternating)")
    ap.add_argument("--straggler", action="store_true", help="worker 1 takes twice its compute time")
    ap.add_argument("--lr", type=float, default=0.05, help="the tables' Adagrad learning rate")
    ap.add_argument("--server-rate", action="store_true", help="only: rows/s of one server thread, in process")
    ap.add_argument("--prefetch", action="store_true",
                    help="ps-async, ps-ssp: pull the next batch's rows during backward")
    ap.add_argument("--hosts", type=int, default=0, metavar="K",
                    help="each worker and server on a namespace host of its own (root; -w and -s default to K)")
    ap.add_argument("--link", default="1gbit", help="with --hosts: each host's link rate, tc's form")
    ap.add_argument("--tcp", metavar="NAME", help="with --hosts: the hosts' TCP congestion control (default: "
                    "this machine's)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker-mode", metavar="MODE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.workers = args.workers or args.hosts or 2
    args.servers = args.servers or args.hosts or 2
    if args.worker_mode:
        worker(args.worker_mode, args)
        return 0
    if args.server_rate:
        server_rate(args.rows)
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    runs: dict[str, list[Job]] = {m: [] for m in modes}
    with contextlib.ExitStack() as stack:
        hosts = None
        if args.hosts:
            from .netns import Hosts
            hosts = stack.enter_context(Hosts(args.hosts, args.link, tcp=args.tcp))
            args.tcp = hosts.tcp            # the report names it
        for _ in range(args.reps):
            for mode in modes:
                started = time.perf_counter()
                runs[mode].append(run_job(mode, args, hosts))
                print(f"  {mode:12s} job done in {time.perf_counter() - started:.0f}s", flush=True)
    report(args, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
