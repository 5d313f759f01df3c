"""Worker for the dashboard tests: a dist_sync loop that runs until the file named by
PS_TEST_STOP exists (at most PS_TEST_SECONDS), so a test can look at the job while it runs.
A restart (--max-restarts) waits PS_TEST_RESTART_DELAY seconds before it joins (so a test
sees the dead node awaited), then resumes where its dead self was. Prints ``rank=<r> pid=<pid>``
when it starts and ``rank=<r> done steps=<n>`` at the end."""
import os
import time

import numpy as np

import ps

stop, limit = os.environ["PS_TEST_STOP"], float(os.environ.get("PS_TEST_SECONDS", "60"))
started = f"{stop}.started-{os.environ.get('DMLC_RANK', os.getpid())}"     # beside the stop file
if os.path.exists(started):
    time.sleep(float(os.environ.get("PS_TEST_RESTART_DELAY", "0")))
open(started, "w").close()
kv = ps.KVStore("dist_sync")
for key in range(3):
    kv.init(key, np.zeros(20_000, np.float32))
kv.init(99, np.zeros(1, np.float32))        # > 0: some worker saw the stop file; all stop at this step
step = kv.resume() if kv.restarted else 0
print(f"rank={kv.rank} pid={os.getpid()}", flush=True)
out = np.zeros(20_000, np.float32)
end, flag = time.monotonic() + limit, np.zeros(1, np.float32)
while True:
    for key in range(3):
        kv.pushpull(key, np.ones(20_000, np.float32), out=out)
    kv.pushpull(99, np.full(1, float(os.path.exists(stop) or time.monotonic() > end), np.float32), out=flag)
    step += 1
    if flag[0] > 0:
        break
    time.sleep(0.02)
kv.barrier()
print(f"rank={kv.rank} done steps={step}", flush=True)
kv.close()
