"""Worker for the launcher tests: a small dist_sync job plus knobs set through --env.

Prints ``rank=<r> sum=<value>`` (every element of key 3 after one push/pull round; with
N workers pushing ones*(rank+1) that is N(N+1)/2). Knobs (environment):
  PS_TEST_SHOW=A,B  print ``env A=<repr(value)>`` for each name
  PS_TEST_FAIL=r:c  the worker of rank r exits with status c after init, without closing
  PS_TEST_HANG=1    print ``ready`` and sleep (for the stop tests)
"""
import os
import sys
import time

import numpy as np

import ps

for name in filter(None, os.environ.get("PS_TEST_SHOW", "").split(",")):
    print(f"env {name}={os.environ.get(name)!r}", flush=True)

kv = ps.KVStore("dist_sync")
kv.init(3, np.ones((2, 3), np.float32))
fail = os.environ.get("PS_TEST_FAIL")
if fail and int(fail.split(":")[0]) == kv.rank:
    print(f"rank={kv.rank} failing", flush=True)
    os._exit(int(fail.split(":")[1]))
if os.environ.get("PS_TEST_HANG"):
    print(f"rank={kv.rank} ready pid={os.getpid()}", flush=True)
    time.sleep(600)
kv.push(3, np.ones((2, 3), np.float32) * (kv.rank + 1))
out = kv.pull(3)
values = sorted(set(out.ravel().tolist()))
print(f"rank={kv.rank} sum={values[0] if len(values) == 1 else values} task={os.environ.get('DMLC_TASK_ID')}",
      flush=True)
kv.close()
sys.exit(0)
