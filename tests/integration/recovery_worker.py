"""A worker of tests/integration/test_recovery.py: deterministic sync training in which
worker 0 may SIGKILL servers or other workers of its own job (found by their environment)
at chosen rounds (several at one round: a machine dying with its server and its worker).

    python recovery_worker.py OUT_DIR ROUNDS OPTIMIZER [--kill ROLE RANK ROUND push|pull]... [--resume]
                              [--kill-before-formation ROLE RANK] [--pace S] [--table sync|async]
                              [--table-load DIR] [--table-save ROUND DIR]

Every worker pushes gradients that depend only on (rank, round, key), so a run that lost
nothing ends with the weights of an unfaulted run. A restarted worker re-runs the loop from
round 0 (the servers answer what its dead self pushed), or with --resume jumps to
``kv.round``. Every rank writes its final weights; rank 0 also to weights.npz. With --table,
each round also pulls and pushes rows of an embedding table (ps.embed) on the servers,
whose rows every rank writes at the end as the key "table". With --table-load, rank 0 puts a
checkpoint of the table (made by this script in DIR if it is not there yet) into it before
round 0, and every rank waits for it at a barrier: a restarted rank 0 re-runs that load. With
--table-save, rank 0 saves the table at the start of that round, and every rank writes the
saved rows at the end as the key "saved".
"""
import argparse
import os
import signal
import time

import numpy as np
import psutil

import ps
from ps.embed import TableSpec, checkpoint
from ps.embed.client import LocalTable
from ps.optim import rowwise

SHAPES = {3: (40,), 5: (120_000,), 7: (17, 33), 9: (1000,)}   # key 5 is cut across both servers


def grad(rank: int, rnd: int, key: int, shape: tuple) -> np.ndarray:
    n = int(np.prod(shape))
    x = np.arange(n, dtype=np.float64)
    return (np.sin(0.001 * x * (key + 1) + 0.37 * rnd + 1.3 * rank) * 0.1).astype(np.float32).reshape(shape)


def table_ids(rank: int, rnd: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + rnd)
    return np.unique(np.r_[rng.integers(-500, 500, 60), [2**62 + rnd % 3, -(2**62)]]).astype(np.int64)


def table_grad(rank: int, rnd: int, ids: np.ndarray) -> np.ndarray:
    x = (ids % 997).astype(np.float64)[:, None] + np.arange(8)
    return (np.cos(0.01 * x + 0.37 * rnd + 1.3 * rank) * 0.1).astype(np.float32)


def all_table_ids(workers: int, rounds: int) -> np.ndarray:
    return np.unique(np.concatenate([table_ids(r, n) for r in range(workers) for n in range(rounds)]))


def make_checkpoint(spec: TableSpec, path: str) -> None:
    """A saved table whose rows and optimizer state differ from a fresh table's."""
    if os.path.exists(os.path.join(path, "table.json")):
        return
    local = LocalTable(spec)
    for rnd in range(3):
        ids = all_table_ids(2, 4)
        local.push(ids, table_grad(7, rnd, ids) * 5)
    checkpoint.save(local, path)


def find(role: str, rank: int) -> psutil.Process:
    """The node's Python process. Under the ssh launcher the remote shell's watchdog (its
    ``cat``) has the node's environment too; killing it stops the node with SIGTERM through
    the watchdog, which is a different test."""
    port = os.environ["DMLC_PS_ROOT_PORT"]
    found = []
    for proc in psutil.process_iter():
        try:
            env, name = proc.environ(), proc.name()
        except (psutil.Error, OSError):
            continue
        if env.get("DMLC_ROLE") == role and env.get("DMLC_PS_ROOT_PORT") == port \
                and env.get("DMLC_RANK") == str(rank) and proc.pid != os.getpid() and name.startswith("python"):
            found.append(proc)
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} Python processes for {role} {rank} of this job, not 1: {found}")
    return found[0]


def kill(role: str, rank: int, rnd: int, sig: int = signal.SIGKILL) -> None:
    if role == "worker" and str(rank) == os.environ.get("DMLC_RANK"):
        print(f"KILL worker {rank} itself at round {rnd}", flush=True)
        os.kill(os.getpid(), sig)
        return
    proc = find(role, rank)
    print(f"{'KILL' if sig == signal.SIGKILL else 'FREEZE'} {role} {rank} pid {proc.pid} at round {rnd}", flush=True)
    proc.send_signal(sig)


def kill_before_formation(role: str, rank: int) -> None:
    """Worker 0, before it registers (so the cluster cannot form yet): SIGKILL a node once it
    has registered (connected to the scheduler, and 1.5 s for the scheduler to watch it), then
    give the launcher's restart a moment to register in its place."""
    port = int(os.environ["DMLC_PS_ROOT_PORT"])
    deadline = time.monotonic() + 30
    while True:
        proc = find(role, rank)
        try:
            if any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                   for c in proc.net_connections(kind="tcp")):
                break
        except psutil.Error:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{role} {rank} did not connect to the scheduler within 30s")
        time.sleep(0.05)
    time.sleep(1.5)
    print(f"KILL {role} {rank} pid {proc.pid} before formation", flush=True)
    proc.send_signal(signal.SIGKILL)
    time.sleep(1.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("rounds", type=int)
    p.add_argument("optimizer", choices=["sgd", "adam", "none"], help="none: the servers keep each round's sum")
    p.add_argument("--kill", nargs=4, action="append", default=[], metavar=("ROLE", "RANK", "ROUND", "WHEN"))
    p.add_argument("--resume", action="store_true")
    p.add_argument("--type", default="dist_sync")
    p.add_argument("--kill-before-formation", nargs=2, metavar=("ROLE", "RANK"))
    p.add_argument("--die-after-init", action="store_true", help="rank 0 kills itself once, before set_optimizer")
    p.add_argument("--lr-at", type=int, default=-1, help="rank 0 sets the servers' learning rate to 0.05 at this round")
    p.add_argument("--die-before-lr", action="store_true", help="rank 0 kills itself once, just before that")
    p.add_argument("--freeze", action="store_true", help="--kill sends SIGSTOP: a hung node, connections open")
    p.add_argument("--pace", type=float, default=0.0, help="sleep this long each round; rank 0 prints ROUND r")
    p.add_argument("--table", choices=["sync", "async"], help="train an embedding table too (Adagrad; async: SGD)")
    p.add_argument("--table-load", metavar="DIR", help="rank 0 loads the table from this checkpoint first")
    p.add_argument("--table-save", nargs=2, metavar=("ROUND", "DIR"), help="rank 0 saves the table then")
    args = p.parse_args()
    if args.kill_before_formation and os.environ.get("DMLC_RANK") == "0":
        kill_before_formation(args.kill_before_formation[0], int(args.kill_before_formation[1]))
    kills: dict[tuple[int, str], list[tuple[str, int]]] = {}    # several at once: a dead machine
    for role, rank, rnd, when in args.kill:
        kills.setdefault((int(rnd), when), []).append((role, int(rank)))
    for victims in kills.values():       # worker 0 itself last
        victims.sort(key=lambda v: v == ("worker", int(os.environ.get("DMLC_RANK", -1))))

    kv = ps.KVStore(args.type)
    if kv.restarted:
        print(f"RESTARTED rank {kv.rank} round {kv.round}", flush=True)
    for key, shape in SHAPES.items():
        kv.init(key, np.full(shape, 0.5, np.float32))
    if args.die_after_init and kv.rank == 0 and not kv.restarted:
        print("KILL worker 0 itself after init", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if args.optimizer != "none":
        kv.set_optimizer(ps.optim.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4) if args.optimizer == "sgd"
                         else ps.optim.Adam(learning_rate=0.01, wd=1e-4))
    table = None
    if args.table:
        opt = rowwise.Adagrad(lr=0.1) if args.table == "sync" else rowwise.SGD(lr=0.1)
        table = kv.table(TableSpec("emb", 8, opt, consistency=args.table))
        if args.table_load:
            if kv.rank == 0:
                make_checkpoint(table.spec, args.table_load)
                print(f"LOADED {checkpoint.load(table, args.table_load)} rows rank 0", flush=True)
            kv.barrier()
    out = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    start = kv.resume() if kv.restarted and args.resume else 0
    if start:               # where its dead self was: the values after round `start`
        for key in SHAPES:
            kv.pull(key, out=out[key])
        rows = kv.row_sparse_pull(7, [0, 16])            # the same round's rows of a 2-d key
        assert np.array_equal(rows.values, out[7][[0, 16]]), "rows differ from the pulled value"
        print(f"RESUMED rank {kv.rank} at round {start}: pulled every key", flush=True)
    for rnd in range(start, args.rounds):
        if rnd == args.lr_at and kv.rank == 0:
            if args.die_before_lr and not kv.restarted:
                print(f"KILL worker 0 itself before set_params at round {rnd}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            kv.server_command("set_params", {"learning_rate": 0.05})
        if args.pace:
            time.sleep(args.pace)
            if kv.rank == 0:
                print(f"ROUND {rnd}", flush=True)
        if args.table_save and rnd == int(args.table_save[0]) and kv.rank == 0:
            print(f"SAVED {checkpoint.save(table, args.table_save[1])} rows rank 0", flush=True)
        if table is not None:
            ids = table_ids(kv.rank, rnd)
            table.pull(ids)
            table.push(ids, table_grad(kv.rank, rnd, ids))
        for key, shape in SHAPES.items():
            kv.push(key, grad(kv.rank, rnd, key, shape))
        if kv.rank == 0 and not kv.restarted and (rnd, "push") in kills:
            for role, rank in kills[(rnd, "push")]:
                kill(role, rank, rnd, signal.SIGSTOP if args.freeze else signal.SIGKILL)
        for key in SHAPES:
            kv.pull(key, out=out[key])
        if kv.rank == 0 and not kv.restarted and (rnd, "pull") in kills:
            for role, rank in kills[(rnd, "pull")]:
                kill(role, rank, rnd, signal.SIGSTOP if args.freeze else signal.SIGKILL)
            time.sleep(0.05)
    kv.barrier()
    for key in SHAPES:              # the final values, after every worker's last round
        kv.pull(key, out=out[key])
    arrays = {str(k): v for k, v in out.items()}
    if table is not None:
        arrays["table"] = table.pull(all_table_ids(kv.num_workers, args.rounds))
    if args.table_save:
        saved = LocalTable(table.spec)
        checkpoint.load(saved, args.table_save[1])
        arrays["saved"] = saved.pull(all_table_ids(kv.num_workers, args.rounds))
    np.savez(os.path.join(args.out, f"weights-rank{kv.rank}.npz"), **arrays)
    if kv.rank == 0:
        np.savez(os.path.join(args.out, "weights.npz"), **arrays)
    print(f"DONE rank {kv.rank} rounds {args.rounds}", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
