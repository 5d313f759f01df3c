"""An MXNet script that profiles the servers as MXNet documents it (profile_process='server')
and the worker with MXNet's own profiler; rank 0 reports what the servers wrote."""
import json
import os

import mxnet as mx

kv = mx.kv.create("dist_sync")
found = {}
try:
    mx.profiler.set_config(filename="p.json", profile_everything=True, profile_process="server")
except mx.base.MXNetError as exc:
    found["unknown_refused"] = str(exc)
mx.profiler.set_config(filename="srv.json", profile_all=True, aggregate_stats=True, profile_process="server")
mx.profiler.set_config(filename=f"worker{kv.rank}.json", profile_all=True, profile_process="worker")
kv.init("w", mx.nd.ones((64, 8)))
kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.1))
mx.profiler.set_state("run", profile_process="server")
mx.profiler.set_state("run", profile_process="worker")
kv._barrier()                         # rank 0 (which sends server commands) has started the servers' profilers
out = mx.nd.zeros((64, 8))
for step in range(4):
    if step in (2, 3):                # the servers record nothing of step 2
        kv._barrier()
        (mx.profiler.pause if step == 2 else mx.profiler.resume)(profile_process="server")
        kv._barrier()
    kv.push("w", mx.nd.ones((64, 8)))
    kv.pull("w", out=out)
    out.wait_to_read()
kv._barrier()                         # every worker's last pull is in before rank 0 stops the servers
mx.profiler.set_state("stop", profile_process="server")
mx.profiler.set_state("stop", profile_process="worker")
mx.profiler.dump(profile_process="worker")
kv._barrier()
if kv.rank == 0:
    for r in range(kv.num_workers):
        doc = json.load(open(f"rank{r}_srv.json"))
        found[f"server{r}"] = [(e["name"], e["args"]["worker"]) for e in doc["traceEvents"] if e.get("cat") == "request"]
found["worker_file"] = os.path.exists(f"worker{kv.rank}.json")
found["final"] = out.asnumpy()[0, 0].item()
print("RESULT " + json.dumps(found), flush=True)
