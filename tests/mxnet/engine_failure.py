"""A Gluon loop whose pushpulls all run in MXNet's engine (update_on_kvstore=False: nothing in
Python waits for them), for tests/mxnet/test_engine_errors.py. Worker 1 leaves after 3 steps
(its store closes, so the next round can never complete) once worker 0 has queued all 30 of
its steps (it says so with a file named by the job's scheduler port). Mode
``waitall``: worker 0 then calls ``mx.nd.waitall()``; mode ``exit``: its script just ends.

    python engine_failure.py waitall|exit [--import-ps]   (--import-ps: PS_MXNET_AUTOLOAD=0's way)
"""
import os
import sys
import tempfile
import time

if "--import-ps" in sys.argv:
    import ps.mxnet  # noqa: F401

import mxnet as mx
from mxnet import autograd, gluon, nd

mode = sys.argv[1]
queued = os.path.join(tempfile.gettempdir(), f"engine_failure-{os.environ['DMLC_PS_ROOT_PORT']}.queued")
kv = mx.kv.create("dist_sync")
net = gluon.nn.Dense(4)
net.initialize(mx.init.One())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv, update_on_kvstore=False)
for step in range(30):
    if kv.rank == 1 and step == 3:
        nd.waitall()
        deadline = time.monotonic() + 60       # worker 0 queues the rest of its steps meanwhile
        while not os.path.exists(queued) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(queued):
            os.unlink(queued)
        print("worker 1 leaves", flush=True)
        sys.exit(0)
    with autograd.record():
        loss = net(nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
print(f"worker {kv.rank} queued every step", flush=True)
if kv.rank == 0:
    open(queued, "w").close()
if mode == "waitall":
    nd.waitall()
print(f"worker {kv.rank} DONE", flush=True)
