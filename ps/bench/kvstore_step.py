"""The kvstore worker of the multi-host benchmark (``--impls ps``, ``native`` and the ps
variants): each host's one worker, on ps's ``KVStore`` or MXNet's native one, timing steps
of a real model's parameter list with compute simulated layer by layer.

A step: the forward pass (1/3 of the compute) walks the keys in order and waits for each
key's new weights before its share; the backward pass (2/3) walks them in reverse and issues
each key's pushpull the moment its share ends (``priority=-index``, as MXNet's Trainer
does). Prints ``TIMED <rank>`` when the timed steps begin (the driver reads the links' load
from then) and one ``RESULT <json>`` line at the end.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any

# A wait for weights longer than this held the forward pass up; a shorter one found them there, and the
# layer starts when the one before it ended, so that sleeps waking late do not add up to compute.
BLOCKED_S = 0.0005


def run(spec: dict[str, Any]) -> None:
    import numpy as np
    shapes = [tuple(s) for s in spec["shapes"]]
    sizes = [int(np.prod(s)) for s in shapes]
    total = sum(sizes)
    compute = spec["compute"]
    fwd = [compute / 3 * n / total for n in sizes]
    bwd = [compute * 2 / 3 * n / total for n in sizes]
    native = spec["impl"] == "native"
    if native:
        import mxnet as mx
        calling = time.time()
        kv = mx.kv.create("dist_sync")
        formed = time.time()        # the cluster formed: the store is made
        grads = [mx.nd.full(s, 0.001 * (kv.rank + 1)) for s in shapes]
        outs = [mx.nd.zeros(s) for s in shapes]
        for i, s in enumerate(shapes):
            kv.init(i, mx.nd.zeros(s))
        kv.barrier() if hasattr(kv, "barrier") else None
    else:
        import ps
        calling = time.time()
        kv = ps.KVStore("dist_sync")
        formed = time.time()
        if spec.get("compression"):
            kv.set_gradient_compression({"type": spec["compression"]})
        grads = [np.full(s, 0.001 * (kv.rank + 1), np.float32) for s in shapes]
        outs = [np.zeros(s, np.float32) for s in shapes]
        kv.init(list(range(len(shapes))), [np.zeros(s, np.float32) for s in shapes])
    handles: list = [None] * len(shapes)

    def wait(i: int) -> None:
        if native:
            outs[i].wait_to_read()
        elif handles[i] is not None:
            handles[i].wait()

    steps, stalls, first_stalls = [], [], []
    clock = time.monotonic          # the driver's clock too: it reads the links' load over the timed steps
    start = window_start = clock()
    for step in range(spec["warmup"] + spec["steps"]):
        if step == spec["warmup"]:
            print(f"TIMED {kv.rank}", flush=True)
            window_start = start
        target = clock()
        stalled = []
        for i in range(len(shapes)):                       # forward: each key's weights, in order
            before = clock()
            wait(i)
            after = clock()
            stalled.append(after - before)
            if after - before > BLOCKED_S:       # the weights came late: the layer starts now
                target = max(target, after)
            target += fwd[i]                     # else it starts when the layer before it ended
            _sleep_until(target, clock)
        stalls.append(sum(stalled))
        first_stalls.append(stalled[0])
        for i in reversed(range(len(shapes))):             # backward: last layer's gradient first
            target += bwd[i]
            _sleep_until(target, clock)
            if native:
                kv.pushpull(i, grads[i], out=outs[i], priority=-i)
            else:
                handles[i] = kv.pushpull(i, grads[i], out=outs[i], priority=-i, block=False)
        now = clock()
        steps.append(now - start)
        start = now
    for i in range(len(shapes)):
        wait(i)
    timed, w = steps[spec["warmup"]:], spec["warmup"] + 1     # a step's forward waits for the step before
    print("RESULT " + json.dumps({"rank": kv.rank, "window": [window_start, start], "calling": calling,
                                  "formed": formed,
                                  "median": statistics.median(timed), "steps": timed,
                                  "stall": statistics.median(stalls[w:] or stalls),
                                  "first_stall": statistics.median(first_stalls[w:] or first_stalls)}), flush=True)
    if not native:
        kv.close()


def _sleep_until(target: float, clock) -> None:
    left = target - clock()
    if left > 0:
        time.sleep(left)
