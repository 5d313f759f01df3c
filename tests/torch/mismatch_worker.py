"""Random sequences of Horovod collectives on every rank, with differences injected into
some ranks' calls (tests/torch/test_mismatch.py).

    python mismatch_worker.py SEED RUNS

Every rank draws the same RUNS sequences from SEED; in some runs one rank's call at one
step differs (its shape, dtype, name, op, scale, root, process set, kind), or the rank skips
it or makes an extra one. A rank stops a run at its first exception and records which
(type, message, seconds it took); every run ends with a collective of a name of its own,
which brings the ranks back together (a rank that skipped a call raises there first, and
tries again). One RESULT line of JSON per rank: per run, the
results' digests (or the exception) — the test holds the ranks' records side by side.
"""
import json
import random
import sys
import time

import numpy as np
import torch

import ps.torch as hvd

KINDS = ("allreduce", "allreduce", "allgather", "broadcast", "grouped", "set")
CHANGES = ("shape", "dtype", "name", "op", "prescale", "root", "kind", "skip", "extra", "set")


def draw(rng, size):
    """One step: what every rank calls, unless a change is injected."""
    kind = rng.choice(KINDS if size > 2 else KINDS[:-1])
    shape = tuple(rng.choice((1, 2, 3)) for _ in range(rng.choice((1, 2))))
    return {"kind": kind, "shape": shape, "dtype": rng.choice(("float32", "float64")),
            "name": rng.choice((None, None, f"t{rng.randrange(3)}")), "op": rng.choice(("Average", "Sum")),
            "prescale": 1.0, "root": rng.randrange(size)}


def change(step, what, rng, size):
    """``step`` as the rank the change is injected into calls it."""
    step = dict(step)
    if what == "set" and size < 3:
        return step                 # no process set of fewer ranks than the job
    if what == "shape":
        step["shape"] = step["shape"] + (2,)
    elif what == "dtype":
        step["dtype"] = "float64" if step["dtype"] == "float32" else "float32"
    elif what == "name":
        step["name"] = f"other{rng.randrange(100)}"
    elif what == "op":
        step["op"] = "Sum" if step["op"] == "Average" else "Average"
    elif what == "prescale":
        step["prescale"] = 0.5
    elif what == "root":
        step["root"] = (step["root"] + 1) % size
    elif what == "kind":
        step["kind"] = "broadcast" if step["kind"] != "broadcast" else "allreduce"
    elif what == "set":
        step["kind"] = "allreduce" if step["kind"] == "set" else "set"
    return step


def value(step, rank, i):
    dtype = getattr(torch, step["dtype"])
    rows = step["shape"][0] + (rank if step["kind"] == "allgather" else 0)
    return torch.full((rows, *step["shape"][1:]), float(rank + 1 + i), dtype=dtype)


def expected(step, size, i, members):
    """The result every rank must get (computed here from every rank's value)."""
    vals = [value(step, r, i).double() for r in members]
    if step["kind"] == "allgather":
        return torch.cat(vals)
    if step["kind"] == "broadcast":
        return vals[members.index(step["root"])] if step["root"] in members else None
    total = sum(v * step["prescale"] for v in vals)
    return total / len(members) if step["op"] == "Average" else total


def right(out, want):
    """A result against what every rank must get (None: this rank expects none)."""
    return want is not None and out.shape == want.shape and bool(torch.allclose(out.double(), want, rtol=1e-6))


def call(step, rank, i, subset):
    """Run ``step``; its result (None where this rank takes no part)."""
    t = value(step, rank, i)
    kind, name = step["kind"], step["name"]
    op = getattr(hvd, step["op"])
    if kind == "allreduce":
        return hvd.allreduce(t, name=name, op=op, prescale_factor=step["prescale"])
    if kind == "allgather":
        return hvd.allgather(t, name=name)
    if kind == "broadcast":
        return hvd.broadcast(t, step["root"], name=name)
    if kind == "grouped":
        return hvd.grouped_allreduce([t, t + 1], name=name, op=op, prescale_factor=step["prescale"])[0]
    if rank not in subset.ranks:
        return None
    return hvd.allreduce(t, name=name, op=op, prescale_factor=step["prescale"], process_set=subset)


def main():
    seed, runs = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    subset = hvd.add_process_set([0, 1]) if size > 2 else None
    rng = random.Random(seed)
    record = []
    for run in range(runs):
        steps = [draw(rng, size) for _ in range(rng.randrange(2, 6))]
        inject = None
        if rng.random() < 0.6:
            inject = (rng.randrange(size), rng.randrange(len(steps)), rng.choice(CHANGES))
        mine = []
        for i, step in enumerate(steps):
            if inject is not None and inject[:2] == (rank, i):
                if inject[2] == "skip":
                    continue
                if inject[2] == "extra":
                    mine.append((i, draw(random.Random(seed * 1000 + run), size)))
                else:
                    step = change(step, inject[2], random.Random(run), size)
            mine.append((i, step))
        got = {"inject": inject, "steps": [], "error": None}
        for i, step in mine:
            started = time.monotonic()
            try:
                out = call(step, rank, i, subset)
            except Exception as exc:        # noqa: BLE001 - recorded for the test to judge
                got["error"] = [type(exc).__name__, str(exc)[:300], round(time.monotonic() - started, 2), i]
                break
            members = subset.ranks if step["kind"] == "set" else list(range(size))
            want = expected(step, size, i, members) if rank in members else None
            good = None if out is None else right(out, want)
            got["steps"].append([i, None if out is None else float(out.double().sum()), good])
        # every rank meets here, whatever happened in the run: a rank that skipped a call
        # learns of it here (the run's error), and meets the others at its next try
        for _ in range(3):
            started = time.monotonic()
            try:
                hvd.allreduce(torch.ones(1), name=f"end.{run}", op=hvd.Sum)
                break
            except Exception as exc:        # noqa: BLE001
                error = [type(exc).__name__, str(exc)[:300], round(time.monotonic() - started, 2), "end"]
                if got["error"] is None:
                    got["error"] = error
                else:
                    got.setdefault("end_errors", []).append(error)
        else:
            got["end_error"] = got.get("end_errors")
        record.append(got)
    hvd.shutdown()
    print("RESULT " + json.dumps({"rank": rank, "runs": record}), flush=True)


if __name__ == "__main__":
    main()
