"""Chaos soak: a long sync job under ``--max-restarts`` while a random server or worker is
SIGKILLed every ~N rounds; the final weights must equal an unfaulted run's.

    python -m ps.bench.chaos --workers 4 --servers 2 --rounds 2000 --kill-every 100
    python -m ps.bench.chaos --pods ...     # the scheduler in the kill set too
    python -m ps.bench.chaos --table ...    # an embedding table too, saved every 50 rounds

Runs the job twice through ``python -m ps.launch``: once untouched (the reference), once with
kills (one at a time: the next waits until the last restart is back). Gradients depend only
on (rank, round, key), and restarted workers resume at ``kv.round``. Prints a JSON summary:
kills, restarts, exit status, rounds completed, max |w - w_ref|, server RSS, wall times.

``--pods`` runs every process of the job on its own, as a Kubernetes Job runs each index of
its pods (started again in place when it dies, same role and rank), so the scheduler is
one more process to kill: its restart rebuilds the job from the live nodes.

``--table``: each round also pulls and pushes rows of an embedding table (sync, Adagrad), and
worker 0 saves the table (ps.embed.checkpoint) every 50 rounds; the table's rows and every save
must equal the unfaulted run's too.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

from launcher.process import start_group, stop_group

SHAPES = {"small": (2, 3), "mid": (40_000,), "big": (300_000,)}     # big: cut across every server
BOUND = "100000"                                                    # MXNET_KVSTORE_BIGARRAY_BOUND
SAVE_EVERY = 50             # --table: worker 0 saves the table every this many rounds
TABLE_DIM = 8


def grad(rank: int, rnd: int, salt: int, shape: tuple) -> np.ndarray:
    x = np.arange(int(np.prod(shape)), dtype=np.float64)
    return (np.sin(0.001 * x * (salt + 1) + 0.37 * rnd + 1.3 * rank) * 0.01).astype(np.float32).reshape(shape)


def table_ids(rank: int, rnd: int) -> np.ndarray:
    rng = np.random.default_rng(7919 * rank + rnd)
    return np.unique(rng.integers(-3000, 3000, 50)).astype(np.int64)


def table_grad(rank: int, rnd: int, ids: np.ndarray) -> np.ndarray:
    x = (ids % 997).astype(np.float64)[:, None] + np.arange(TABLE_DIM)
    return (np.cos(0.01 * x + 0.37 * rnd + 1.3 * rank) * 0.1).astype(np.float32)


def saved_rows(path: str) -> dict[str, np.ndarray]:
    """A save's rows in id order: ids, values and each optimizer state (``state_<name>``), read
    back through ps.embed.checkpoint into a table of this process."""
    from ps.embed import LocalTable, TableSpec, checkpoint
    from ps.optim import rowwise
    table = LocalTable(TableSpec("chaos", TABLE_DIM, rowwise.Adagrad(lr=0.1)))
    checkpoint.load(table, path)
    chunks = list(table.chunks(changed_only=False))
    rows = {"ids": np.concatenate([c.ids for c in chunks]), "values": np.concatenate([c.values for c in chunks]),
            **{f"state_{k}": np.concatenate([c.state[k] for c in chunks]) for k in table.rows.state}}
    order = np.argsort(rows["ids"])
    return {k: v[order] for k, v in rows.items()}


def compare_saves(ref_dir: str, run_dir: str) -> float | None:
    """The largest difference between the two runs' saves (inf: one is missing, or holds a
    trained row the other lacks); None when there are none. Another worker's lookups of the
    next round may make rows during a save, at their initial values, so a row only one run
    saved counts if it was ever updated (its Adagrad sum is not zero)."""
    names = sorted(n for n in os.listdir(ref_dir) if n.startswith("save-"))
    diff = None
    for name in names:
        if not os.path.exists(os.path.join(run_dir, name, "table.json")):
            return float("inf")
        a, b = saved_rows(os.path.join(ref_dir, name)), saved_rows(os.path.join(run_dir, name))
        if a.keys() != b.keys():
            return float("inf")
        for x, y in ((a, b), (b, a)):
            alone = ~np.isin(x["ids"], y["ids"])
            if np.any(x["state_sum"][alone] != 0):
                return float("inf")
        both_a, both_b = np.isin(a["ids"], b["ids"]), np.isin(b["ids"], a["ids"])
        d = max(float(np.abs(a[k][both_a] - b[k][both_b]).max(initial=0.0)) for k in a if k != "ids")
        diff = d if diff is None else max(diff, d)
    return diff


def worker(out: str, rounds: int, with_table: bool = False) -> None:
    import ps
    from ps.embed import TableSpec, checkpoint
    from ps.optim import rowwise
    kv = ps.KVStore("dist_sync")
    kv.init(list(SHAPES), [np.full(s, 0.5, np.float32) for s in SHAPES.values()])
    kv.set_optimizer(ps.optim.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4))
    table = kv.table(TableSpec("chaos", TABLE_DIM, rowwise.Adagrad(lr=0.1))) if with_table else None
    start = kv.resume() if kv.restarted else 0
    if kv.restarted:
        print(f"RESTARTED worker {kv.rank} at round {start}", flush=True)
    vals = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    for rnd in range(start, rounds):
        if table is not None:
            if kv.rank == 0 and rnd and rnd % SAVE_EVERY == 0:      # between steps: no round closes
                checkpoint.save(table, os.path.join(out, f"save-{rnd:06d}"))
            ids = table_ids(kv.rank, rnd)
            table.pull(ids)
            table.push(ids, table_grad(kv.rank, rnd, ids))
        for salt, (key, shape) in enumerate(SHAPES.items()):
            kv.push(key, grad(kv.rank, rnd, salt, shape))
        for key in SHAPES:
            kv.pull(key, out=vals[key])
        if kv.rank == 0 and rnd % 10 == 0:
            print(f"ROUND {rnd}", flush=True)
    kv.barrier()
    for key in SHAPES:
        kv.pull(key, out=vals[key])
    if table is not None:
        vals["table"] = table.pull(np.unique(np.concatenate([table_ids(r, n) for r in range(kv.num_workers)
                                                              for n in range(rounds)])))
    if kv.rank == 0:
        np.savez(os.path.join(out, "weights.npz"), **vals)
    print(f"FINISHED worker {kv.rank}", flush=True)
    kv.close()


def job_pids(port: str) -> dict[tuple[str, int], int]:
    """(role, rank) -> pid of the live servers and workers of the job on scheduler ``port``."""
    found = {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("DMLC_PS_ROOT_PORT") == port and env.get("DMLC_ROLE") in ("server", "worker") \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found[(env["DMLC_ROLE"], int(env["DMLC_RANK"]))] = proc.pid
        except (psutil.Error, OSError, KeyError, ValueError):
            continue
    return found


def run_job(args: argparse.Namespace, out: str, kill_every: int, rng: random.Random) -> dict:
    cmd = [sys.executable, "-m", "ps.launch", "-n", str(args.workers), "-s", str(args.servers), "--launcher", "local",
           "--max-restarts", str(args.max_restarts if kill_every else 0),
           sys.executable, "-m", "ps.bench.chaos", "--worker-mode", out, str(args.rounds),
           *(["--table"] if args.table else [])]
    env = {**os.environ, "MXNET_KVSTORE_BIGARRAY_BOUND": BOUND, "PS_CONNECT_TIMEOUT": "60"}
    proc = start_group(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    started, port, last_round, kills, back = time.time(), None, -1, [], True
    next_kill = kill_every + rng.randrange(-kill_every // 3, kill_every // 3 + 1) if kill_every else None
    rss: dict[int, list[int]] = {}
    log = open(os.path.join(out, "job.log"), "w")
    last_sample = 0.0
    while proc.poll() is None or not lines.empty():
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            line = None
        if line is not None:
            log.write(line)
            if port is None and (m := re.search(r"scheduler 127\.0\.0\.1:(\d+)", line)):
                port = m.group(1)
            if m := re.search(r"\[worker 0\] ROUND (\d+)", line):
                last_round = max(last_round, int(m.group(1)))
            if "is back after" in line:
                back = True
        if time.time() - started > args.timeout:
            stop_group(proc)
            break
        if port and time.time() - last_sample > 1.0:
            last_sample = time.time()
            for (role, rank), pid in job_pids(port).items():
                if role == "server":
                    try:
                        rss.setdefault(rank, []).append(psutil.Process(pid).memory_info().rss // 1024)
                    except psutil.Error:
                        pass
        if next_kill is not None and port and back and last_round >= next_kill \
                and last_round < args.rounds - 20 and len(kills) < args.max_restarts:
            pids = job_pids(port)
            if pids:
                target = rng.choice(sorted(pids))
                os.kill(pids[target], signal.SIGKILL)
                kills.append({"round": last_round, "role": target[0], "rank": target[1]})
                back = False
                next_kill = last_round + kill_every + rng.randrange(-kill_every // 3, kill_every // 3 + 1)
    code = proc.wait()
    log.close()
    text = open(os.path.join(out, "job.log")).read()
    return {"exit": code, "seconds": round(time.time() - started, 1), "kills": kills,
            "restarts": text.count("starting it again"), "last_round": last_round,
            "server_rss_kb": {r: [v[0], v[-1]] for r, v in rss.items() if v}}


def run_pods(args: argparse.Namespace, out: str, kill_every: int, rng: random.Random) -> dict:
    """The job as pods: each process on its own, started again in place when killed."""
    from ps.netutil import free_port
    port = str(free_port())
    env = {**os.environ, "MXNET_KVSTORE_BIGARRAY_BOUND": BOUND, "PS_CONNECT_TIMEOUT": "60",
           "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": port, "DMLC_NUM_SERVER": str(args.servers),
           "DMLC_NUM_WORKER": str(args.workers), "PS_MAX_RESTARTS": str(args.max_restarts if kill_every else 0)}
    pods = [("scheduler", 0)] + [("server", r) for r in range(args.servers)] + \
        [("worker", r) for r in range(args.workers)]
    lines: queue.SimpleQueue = queue.SimpleQueue()

    def start(role: str, rank: int) -> subprocess.Popen:
        argv = [sys.executable, "-m", "ps"] if role != "worker" else \
            [sys.executable, "-m", "ps.bench.chaos", "--worker-mode", out, str(args.rounds),
             *(["--table"] if args.table else [])]
        proc = start_group(argv, {**env, "DMLC_ROLE": role, "DMLC_RANK": str(rank)}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: [lines.put(f"[{role} {rank}] {ln}") for ln in proc.stdout],
                         daemon=True).start()
        return proc

    procs = {pod: start(*pod) for pod in pods}
    started, last_round, kills, killed, ended, failed = time.time(), -1, [], set(), {}, None
    back = True
    next_kill = kill_every + rng.randrange(-kill_every // 3, kill_every // 3 + 1) if kill_every else None
    log = open(os.path.join(out, "job.log"), "w")
    while len(ended) < len(pods) and failed is None:
        try:
            line = lines.get(timeout=0.2)
            log.write(line)
            if m := re.search(r"\[worker 0\] ROUND (\d+)", line):
                last_round = max(last_round, int(m.group(1)))
            if "is back after" in line or "every node of the job reported" in line:
                back = True
        except queue.Empty:
            pass
        for pod, proc in procs.items():
            code = proc.poll()
            if code is None or pod in ended:
                continue
            if pod in killed:                # as a Job does: the same index started again
                killed.discard(pod)
                time.sleep(0.5 if pod[0] == "scheduler" else 0.0)
                procs[pod] = start(*pod)
                break
            ended[pod] = code
            if code != 0:
                failed = f"{pod[0]} {pod[1]} exited {code}"
        if time.time() - started > args.timeout:
            failed = f"timeout after {args.timeout:g}s"
        if next_kill is not None and back and last_round >= next_kill and last_round < args.rounds - 20 \
                and len(kills) < args.max_restarts:
            live = sorted(p for p in pods if p not in ended and procs[p].poll() is None)
            target = rng.choice(live)
            procs[target].send_signal(signal.SIGKILL)
            killed.add(target)
            kills.append({"round": last_round, "role": target[0], "rank": target[1]})
            back = False
            next_kill = last_round + kill_every + rng.randrange(-kill_every // 3, kill_every // 3 + 1)
    for proc in procs.values():
        stop_group(proc)
    log.close()
    return {"exit": 0 if failed is None else 1, "failure": failed, "seconds": round(time.time() - started, 1),
            "kills": kills, "last_round": last_round}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--kill-every", type=int, default=100, help="rounds between kills (+-1/3, at random)")
    ap.add_argument("--max-restarts", type=int, default=40)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--pods", action="store_true",
                    help="each process on its own, restarted in place (as Kubernetes Jobs): the scheduler is killed too")
    ap.add_argument("--table", action="store_true",
                    help="an embedding table too, saved by worker 0 every 50 rounds; its rows and saves are checked")
    ap.add_argument("--worker-mode", nargs=2, metavar=("OUT", "ROUNDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_mode:
        worker(args.worker_mode[0], int(args.worker_mode[1]), args.table)
        return 0
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="ps-chaos-") as tmp:
        ref_dir, run_dir = os.path.join(tmp, "ref"), os.path.join(tmp, "run")
        os.makedirs(ref_dir)
        os.makedirs(run_dir)
        job = run_pods if args.pods else run_job
        ref = job(args, ref_dir, 0, rng)
        run = job(args, run_dir, args.kill_every, rng)
        diff = None
        if os.path.exists(os.path.join(ref_dir, "weights.npz")) and os.path.exists(os.path.join(run_dir, "weights.npz")):
            with np.load(os.path.join(ref_dir, "weights.npz")) as a, np.load(os.path.join(run_dir, "weights.npz")) as b:
                diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
        saves = compare_saves(ref_dir, run_dir) if args.table else None
        summary = {"seed": seed, "workers": args.workers, "servers": args.servers, "rounds": args.rounds,
                   "table": args.table, "reference": ref, "faulted": run, "max_abs_diff": diff,
                   **({"saves_max_abs_diff": saves} if args.table else {})}
        print(json.dumps(summary, indent=1))
        if run["exit"] != 0:
            print(open(os.path.join(run_dir, "job.log")).read()[-5000:], file=sys.stderr)
        return 0 if run["exit"] == 0 and diff == 0.0 and (not args.table or saves == 0.0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
