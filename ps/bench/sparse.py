"""Sparse benchmark: a row_sparse embedding through MXNet's kvstore API, ps vs native ps-lite.

Each job is W workers x S servers on 127.0.0.1 (``dist_sync``, lazy SGD on the servers) with
a ROWS x DIM float32 table (2M x 64 = 512 MB by default). A step is what a sparse trainer
does per batch: push the gradient of BATCH random distinct rows (``row_sparse``), then
``row_sparse_pull`` those rows. Jobs alternate ps / native, ``--reps`` times each.

Bytes per worker and step: ps counts what its van sends and receives (meta and data frames;
ps talks to servers on the same machine over ipc://); native MXNet's traffic is read from the
loopback interface (``/proc/net/dev``, all processes: the job's sends over the timed steps,
divided by workers and steps; TCP/IP headers included). The ideal is 2 x BATCH x DIM x 4
(the rows up, the rows down).

    python -m ps.bench.sparse                       # 2M x 64, 4096 rows, W2 S2
    python -m ps.bench.sparse --rows 200000 --reps 1 --steps 10   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from launcher.process import start_group, stop_group
from ps.netutil import free_port

PYTHON = sys.executable


def lo_bytes() -> int:
    """Bytes the loopback interface carried so far (transmit side)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    return 0


def worker(impl: str, rows: int, dim: int, batch: int, steps: int, warmup: int) -> None:
    """One worker: the timed steps; prints a JSON line."""
    import mxnet as mx
    import numpy as np
    if impl == "ps":
        import ps.mxnet  # noqa: F401 - registers ps's dist_sync
    kv = mx.kv.create("dist_sync")
    # every row present: native MXNet's init of a row_sparse value with no rows never returns
    kv.init(0, mx.nd.ones((rows, dim)).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01))
    rng = np.random.default_rng(kv.rank)
    out = mx.nd.sparse.zeros("row_sparse", (rows, dim))
    times = []
    stats = kv if hasattr(kv, "transport_stats") else None     # ps's store; native has no counters
    sent = received = lo = 0
    for step in range(warmup + steps):
        ids = np.sort(rng.choice(rows, batch, replace=False))
        grad = mx.nd.sparse.row_sparse_array((rng.standard_normal((batch, dim)).astype(np.float32), ids),
                                             shape=(rows, dim))
        grad.wait_to_read()
        if step == warmup:                     # sync pushes keep the workers in step
            lo = lo_bytes()
            if stats is not None:
                before = stats.transport_stats()
                sent, received = before["bytes_sent"], before["bytes_received"]
        start = time.perf_counter()
        kv.push(0, grad)
        kv.row_sparse_pull(0, out=out, row_ids=mx.nd.array(ids))
        out.wait_to_read()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    result = {"rank": kv.rank, "step_ms": [t * 1e3 for t in times], "lo_bytes": lo_bytes() - lo,
              "rows_back": int(out.indices.shape[0])}
    if stats is not None:
        after = stats.transport_stats()
        result["ps_bytes"] = after["bytes_sent"] - sent + after["bytes_received"] - received
    print("RESULT " + json.dumps(result), flush=True)


def run_job(impl: str, args: argparse.Namespace) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
    env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER=str(args.servers),
               DMLC_NUM_WORKER=str(args.workers), PS_CONNECT_TIMEOUT="120", PS_MXNET_AUTOLOAD="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
    role = ["-m", "ps"] if impl == "ps" else ["-c", "import mxnet"]
    procs = [start_group([PYTHON, *role], {**env, "DMLC_ROLE": "scheduler"})]
    procs += [start_group([PYTHON, *role], {**env, "DMLC_ROLE": "server"}) for _ in range(args.servers)]
    argv = [PYTHON, "-m", "ps.bench.sparse", "--worker-mode", impl, "--rows", str(args.rows), "--dim", str(args.dim),
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    workers = [start_group(argv, {**env, "DMLC_ROLE": "worker"}, stdout=-1, stderr=-1, text=True)
               for _ in range(args.workers)]
    try:
        outs = [w.communicate(timeout=args.timeout) for w in workers]
    finally:
        for p in workers + procs:
            stop_group(p, grace=10)
    results = []
    for w, (out, err) in zip(workers, outs):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if w.returncode != 0 or not lines:
            raise RuntimeError(f"{impl} worker failed (exit {w.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[0][7:]))
    per_step = [statistics.median(r["step_ms"]) for r in results]
    if impl == "ps":
        nbytes = statistics.mean(r["ps_bytes"] for r in results) / args.steps
    else:
        nbytes = max(r["lo_bytes"] for r in results) / args.steps / args.workers
    return {"impl": impl, "step_ms": max(per_step), "bytes_per_step": nbytes,
            "rows_back": [r["rows_back"] for r in results]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096, help="distinct random rows per step")
    ap.add_argument("-w", "--workers", type=int, default=2)
    ap.add_argument("-s", "--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2, help="jobs per implementation (alternating)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--worker-mode", metavar="IMPL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_mode:
        worker(args.worker_mode, args.rows, args.dim, args.batch, args.steps, args.warmup)
        return 0
    ideal = 2 * args.batch * args.dim * 4
    runs: dict[str, list[dict]] = {"ps": [], "native": []}
    for _ in range(args.reps):
        for impl in ("ps", "native"):
            res = run_job(impl, args)
            runs[impl].append(res)
            print(f"  {impl:6s} step {res['step_ms']:8.2f} ms   {res['bytes_per_step'] / 1e6:7.3f} MB/step", flush=True)
    med = {impl: {k: statistics.median(r[k] for r in rs) for k in ("step_ms", "bytes_per_step")}
           for impl, rs in runs.items()}
    print(f"\nrow_sparse embedding {args.rows} x {args.dim} float32, {args.batch} rows/step, "
          f"W{args.workers} S{args.servers}, dist_sync, median of {args.reps} jobs x {args.steps} steps")
    print("| impl | step (ms) | bytes/step (MB) | bytes / ideal |")
    print("|---|---:|---:|---:|")
    for impl in ("ps", "native"):
        m = med[impl]
        print(f"| {impl} | {m['step_ms']:.2f} | {m['bytes_per_step'] / 1e6:.3f} | {m['bytes_per_step'] / ideal:.3f} |")
    print(f"\nps step time / native: {med['ps']['step_ms'] / med['native']['step_ms']:.2f}   "
          f"(ideal bytes/step {ideal / 1e6:.3f} MB: the rows up and down)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
