"""A training loop that survives its own death: run it under ``--max-restarts``.

    python -m ps.launch -n 2 -s 2 --max-restarts 1 python examples/restart_train.py --crash-at 30

Linear regression on data generated from the step number, so a restarted worker finds its
data position from the step alone. With ``--crash-at S`` worker 1 kills itself (SIGKILL) at
step S, once: the launcher starts it again, the restart asks the servers where its dead self
had got to (``kv.round``), jumps there (``kv.resume()``) and the job finishes as if nothing
happened. Without ``kv.resume()`` it would re-run the steps from 0 and the servers would
answer those its dead self had done without applying them again: also correct, only slower.
"""
import argparse
import os
import signal
import tempfile

import numpy as np

import ps

DIM, BATCH = 64, 32


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """This worker's data at ``step``: the data position is a function of the step."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    true_w = np.linspace(-1, 1, DIM, dtype=np.float32)
    return x, x @ true_w + 0.01 * rng.standard_normal(BATCH).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--crash-at", type=int, default=-1, help="worker 1 kills itself at this step, once")
    args = p.parse_args()

    kv = ps.KVStore("dist_sync")
    kv.init("w", np.zeros(DIM, np.float32))
    kv.set_optimizer(ps.optim.SGD(learning_rate=0.1, momentum=0.5, rescale_grad=1.0 / kv.num_workers))
    start = 0
    if kv.restarted:
        start = kv.resume()         # the steps my dead self completed; my next push counts as step `start`
        print(f"worker {kv.rank} restarted: resuming at step {start}", flush=True)
    # one crash per job: remember it next to the scheduler's address
    marker = os.path.join(tempfile.gettempdir(), f"restart_train-{os.environ.get('DMLC_PS_ROOT_PORT')}.crashed")
    w = kv.pull("w")
    for step in range(start, args.steps):
        if kv.rank == 1 and step == args.crash_at and not os.path.exists(marker):
            open(marker, "w").close()
            print(f"worker 1 crashes at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, kv.rank)
        grad = x.T @ (x @ w - y) / BATCH
        kv.pushpull("w", grad.astype(np.float32), out=w)
        if kv.rank == 0 and step % 10 == 0:
            x, y = batch(10_000, 0)              # a fixed held-out batch
            print(f"step {step}: loss {float(np.mean((x @ w - y) ** 2)):.5f}", flush=True)
    kv.barrier()
    w = kv.pull("w")
    x, y = batch(10_000, 0)
    print(f"worker {kv.rank}: final loss {float(np.mean((x @ w - y) ** 2)):.6f}, w[:3] {w[:3].round(4).tolist()}",
          flush=True)
    if os.path.exists(marker) and kv.rank == 0:
        os.unlink(marker)
    kv.close()


if __name__ == "__main__":
    main()
