"""PyTorch benchmark: ps.torch's DistributedOptimizer against one process and against
``torch.distributed`` DDP (gloo), the same 2-worker job on this machine.

A step is forward, backward and optimizer step of an MLP (``--width`` wide, 3 hidden layers)
on a batch of ``--batch`` samples per worker. Every process gets one compute thread
(``OMP_NUM_THREADS=1``), so workers and ps's servers do not fight over the cores with
PyTorch's own thread pools. Jobs alternate ps / DDP / one process, ``--reps`` times each.

    python -m ps.bench.torch                    # width 1024 (2.63M parameters), W2 S2
    python -m ps.bench.torch --width 256 --steps 20 --reps 1   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from launcher.process import start_group, stop_group
from ps.netutil import free_port

from .cluster import worker_results

PYTHON = sys.executable
IN, OUT = 512, 10


def _model(width: int):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, OUT))


def worker(mode: str, width: int, batch: int, steps: int, warmup: int) -> None:
    """One process of a job: time each step, print RESULT."""
    import torch
    torch.set_num_threads(1)
    model = _model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rank = 0
    if mode == "ps":
        import ps.torch as hvd
        hvd.init()
        rank = hvd.rank()
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    elif mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, IN, generator=gen), torch.randint(0, OUT, (batch,), generator=gen)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(1000 * (time.perf_counter() - start))
    if mode == "ddp":
        dist.barrier()
    print("RESULT " + json.dumps({"step_ms": times}), flush=True)
    if mode == "ps":
        hvd.shutdown()
    elif mode == "ddp":       # destroy_process_group can hang when rank 0's store closes first
        sys.stdout.flush()
        os._exit(0)


def run_job(mode: str, args: argparse.Namespace) -> float:
    """Median step time (ms) of the slowest worker of one job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PS_MXNET_AUTOLOAD="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this ps checkout
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    me = [PYTHON, "-m", "ps.bench.torch", "--worker-mode", mode, "--width", str(args.width), "--batch",
          str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    procs, workers = [], []
    logs = [tempfile.TemporaryFile("w+") for _ in range(args.workers if mode != "one" else 1)]
    if mode == "ps":
        port = free_port()
        env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER=str(args.servers),
                   DMLC_NUM_WORKER=str(args.workers), PS_CONNECT_TIMEOUT="120")
        procs = [start_group([PYTHON, "-m", "ps"], {**env, "DMLC_ROLE": "scheduler"})]
        procs += [start_group([PYTHON, "-m", "ps"], {**env, "DMLC_ROLE": "server"}) for _ in range(args.servers)]
        workers = [start_group(me, {**env, "DMLC_ROLE": "worker"}, stdout=-1, stderr=log, text=True)
                   for log in logs]
    elif mode == "ddp":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.workers))
        workers = [start_group(me, {**env, "RANK": str(r)}, stdout=-1, stderr=log, text=True)   # gloo can be chatty
                   for r, log in enumerate(logs)]
    else:
        workers = [start_group(me, env, stdout=-1, stderr=logs[0], text=True)]
    try:
        outs = [w.communicate(timeout=args.timeout) for w in workers]
    finally:
        for p in workers + procs:
            stop_group(p, grace=10)
    return max(statistics.median(r["step_ms"]) for r in worker_results(mode, workers, outs, logs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="samples per worker and step")
    ap.add_argument("-w", "--workers", type=int, default=2)
    ap.add_argument("-s", "--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2, help="jobs per mode (alternating)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--worker-mode", metavar="MODE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_mode:
        worker(args.worker_mode, args.width, args.batch, args.steps, args.warmup)
        return 0
    modes = ("ps", "ddp", "one")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.reps):
        for mode in modes:
            runs[mode].append(run_job(mode, args))
            print(f"  {mode:4s} step {runs[mode][-1]:8.2f} ms", flush=True)
    params = IN * args.width + 2 * args.width * args.width + args.width * OUT + 3 * args.width + OUT
    med = {m: statistics.median(v) for m, v in runs.items()}
    print(f"\nMLP {IN}-{args.width}x3-{OUT} ({params / 1e6:.2f}M parameters, {4 * params / 1e6:.1f} MB), "
          f"batch {args.batch}/worker, W{args.workers} (ps: S{args.servers}), one thread per process, "
          f"median of {args.reps} jobs x {args.steps} steps")
    print("| mode | step (ms) | / one process |")
    print("|---|---:|---:|")
    names = {"ps": "ps.torch DistributedOptimizer", "ddp": "torch DDP (gloo)", "one": "one process"}
    for m in modes:
        print(f"| {names[m]} | {med[m]:.2f} | {med[m] / med['one']:.2f} |")
    print(f"\nps.torch step time / DDP: {med['ps'] / med['ddp']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
