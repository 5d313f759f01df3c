"""Worker driver for ``python -m ps.bench``: one process per worker, ps or native MXNet.

    python -m ps.bench.worker '{"impl": "ps", "mode": "kv", "cases": [...]}'

The parent talks to it in JSON lines: commands on stdin, answers on a private copy of
stdout (fd 1 itself is pointed at stderr, so whatever the libraries print cannot corrupt
the protocol). After start-up (join the cluster, init every key of every case) it answers
``{"ready": true, ...}``, then serves these commands:

* ``{"op": "run", "case": NAME, "rounds": R, "warmup": N}``: N untimed rounds, then R
  timed rounds; a round is a non-blocking pushpull of every key of the case followed by
  one wait (ps: ``kv.wait_all()``, native: ``mx.nd.waitall()``). Answers per-round ms.
* ``{"op": "gluon", "steps": R, "warmup": N}`` (mode ``gluon``): timed training steps.
* ``{"op": "stats"}`` (ps only): bytes each server stores, with its port.
* ``{"op": "quit"}``: close the store and exit 0.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np


def _answer_channel() -> Any:
    """Keep the real stdout for answers; send fd 1 (library prints) to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


class PsDriver:
    """Rounds of ``kv.pushpull(k, g, out=w, block=False)`` then ``kv.wait_all()``."""

    def __init__(self, spec: dict[str, Any]):
        import ps
        self.kv = ps.KVStore(spec.get("kvtype", "dist_sync"))
        self.rank = self.kv.rank
        self.cases: dict[str, tuple[list[int], list[np.ndarray], list[np.ndarray]]] = {}
        for case in spec["cases"]:
            keys = [case["base"] + i for i in range(case["keys"])]
            grads = [np.full(case["elems"], self.rank + 1, np.float32) for _ in keys]
            outs = [np.zeros(case["elems"], np.float32) for _ in keys]
            self.kv.init(keys, [np.zeros(case["elems"], np.float32) for _ in keys])
            self.cases[case["name"]] = (keys, grads, outs)
        opt = spec.get("optimizer")
        if opt:
            self.kv.set_optimizer(ps.optim.SGD(learning_rate=0.01, momentum=0.9 if opt == "momentum" else 0.0))

    def round_fn(self, name: str) -> Callable[[], None]:
        keys, grads, outs = self.cases[name]
        kv = self.kv

        def one_round() -> None:
            for k, g, o in zip(keys, grads, outs):
                kv.pushpull(k, g, out=o, block=False)
            kv.wait_all()
        return one_round

    def stats(self) -> dict[str, Any]:
        replies = self.kv.server_command("stats")
        nodes = self.kv.nodes
        return {str(sid): {"bytes": r["bytes"], "keys": r["keys"], "port": nodes[sid].port}
                for sid, r in replies.items()}

    def close(self) -> None:
        self.kv.close()


class NativeDriver:
    """MXNet's own dist kvstore: ``kv.pushpull`` (or push then pull) then ``mx.nd.waitall()``."""

    def __init__(self, spec: dict[str, Any]):
        import mxnet as mx
        self.mx = mx
        self.kv = mx.kv.create(spec.get("kvtype", "dist_sync"))
        self.rank = self.kv.rank
        self.native_op = spec.get("native_op", "pushpull")
        self.cases: dict[str, tuple[list[int], list[Any], list[Any]]] = {}
        for case in spec["cases"]:
            keys = [case["base"] + i for i in range(case["keys"])]
            shape = (case["elems"],)
            grads = [mx.nd.full(shape, self.rank + 1, dtype="float32") for _ in keys]
            outs = [mx.nd.zeros(shape, dtype="float32") for _ in keys]
            self.kv.init(keys, [mx.nd.zeros(shape, dtype="float32") for _ in keys])
            self.cases[case["name"]] = (keys, grads, outs)
        opt = spec.get("optimizer")
        if opt:
            self.kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9 if opt == "momentum" else 0.0))
        mx.nd.waitall()

    def round_fn(self, name: str, op: str | None = None) -> Callable[[], None]:
        keys, grads, outs = self.cases[name]
        kv, waitall = self.kv, self.mx.nd.waitall
        if (op or self.native_op) == "push-pull":
            def one_round() -> None:
                for k, g in zip(keys, grads):
                    kv.push(k, g)
                for k, o in zip(keys, outs):
                    kv.pull(k, out=o)
                waitall()
        else:
            def one_round() -> None:
                for k, g, o in zip(keys, grads, outs):
                    kv.pushpull(k, g, out=o)
                waitall()
        return one_round

    def close(self) -> None:
        self.mx.nd.waitall()
        del self.kv            # rank 0 stops the servers when the store is destroyed


def timed(fn: Callable[[], None], rounds: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    clock = time.perf_counter
    for _ in range(rounds):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e3)
    return times


def run_case(driver: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    rounds, warmup = int(cmd["rounds"]), int(cmd.get("warmup", 2))
    if isinstance(driver, NativeDriver) and driver.native_op == "best":
        # both native variants on the same rounds; the parent keeps the better median
        pp = timed(driver.round_fn(cmd["case"], "pushpull"), rounds, warmup)
        pl = timed(driver.round_fn(cmd["case"], "push-pull"), rounds, warmup)
        better = pp if np.median(pp) <= np.median(pl) else pl
        return {"times_ms": better, "variant": "pushpull" if better is pp else "push-pull",
                "alt_median_ms": float(np.median(pl if better is pp else pp)),
                "rounds_run": 2 * (rounds + warmup)}
    profile = cmd.get("profile")
    if profile:
        import cProfile
        prof = cProfile.Profile()
        fn = driver.round_fn(cmd["case"])
        for _ in range(warmup):
            fn()
        prof.enable()
        times = timed(fn, rounds, 0)
        prof.disable()
        prof.dump_stats(f"{profile}.rank{driver.rank}")
        return {"times_ms": times, "rounds_run": rounds + warmup}
    return {"times_ms": timed(driver.round_fn(cmd["case"]), rounds, warmup), "rounds_run": rounds + warmup}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    answers = _answer_channel()

    def answer(obj: dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        if spec.get("mode") == "gluon":
            from .gluon import GluonDriver
            driver: Any = GluonDriver(spec)
        elif spec["impl"] == "native":
            driver = NativeDriver(spec)
        else:
            driver = PsDriver(spec)
    except Exception:  # noqa: BLE001 - reported to the parent, which shows it
        answer({"ok": False, "error": traceback.format_exc()})
        return 1
    answer({"ok": True, "ready": True, "rank": driver.rank, "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            break
        try:
            if op == "run":
                result = run_case(driver, cmd)
            elif op == "gluon":
                result = driver.run(int(cmd["steps"]), int(cmd.get("warmup", 3)), cmd.get("sync", "loss"))
            elif op == "stats":
                result = {"servers": driver.stats() if hasattr(driver, "stats") and spec["impl"] == "ps" else {}}
            else:
                raise ValueError(f"unknown command {op!r}")
            answer({"ok": True, **result})
        except Exception:  # noqa: BLE001
            answer({"ok": False, "error": traceback.format_exc()})
    try:
        driver.close()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    answers.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
