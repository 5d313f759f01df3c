"""MXNet's error behaviour and row_sparse_pull results, from a plain MXNet script (no `import ps`)
run under `python -m ps.launch`: test_parity.py checks what it prints."""
import json
import pickle

import mxnet as mx
import numpy as np


def outcome(fn):
    try:
        fn()
        return "no error"
    except mx.base.MXNetError as exc:
        return f"MXNetError: {exc}"
    except Exception as exc:  # noqa: BLE001 - the test shows which type it was
        return f"{type(exc).__name__}: {exc}"


kv = mx.kv.create("dist_sync")
found = {"store": type(kv).__module__,
         "uninitialized": outcome(lambda: kv.pull("nokey", out=mx.nd.zeros(2))),
         "push_uninitialized": outcome(lambda: kv.push("nokey", mx.nd.zeros(2)))}
kv.init("w", mx.nd.array(np.arange(12).reshape(6, 2)))
rs = mx.nd.sparse.zeros("row_sparse", (6, 2))
found["ignore_sparse_false"] = outcome(lambda: kv.pull("w", out=rs, ignore_sparse=False))
found["ignore_sparse_true"] = outcome(lambda: kv.pull("w", out=rs))
kv.row_sparse_pull("w", out=rs, row_ids=mx.nd.array([3, 1, 3], dtype="int64"))
found["rows"], found["data"] = rs.indices.asnumpy().tolist(), rs.data.asnumpy().tolist()
kv.row_sparse_pull("w", out=rs, row_ids=mx.nd.array([], dtype="int64"))
found["empty_rows"] = rs.indices.asnumpy().tolist()
found["server_profiling"] = outcome(lambda: mx.profiler.set_config(filename="s.json", profile_process="server"))
found["server_profiling_path"] = outcome(lambda: mx.profiler.set_config(filename="../s.json",
                                                                        profile_process="server"))
found["worker_profiling"] = outcome(lambda: mx.profiler.set_config(filename="w.json", profile_process="worker"))
found["none_key"] = outcome(lambda: kv.push(None, mx.nd.zeros(2)))
# any name with "dist" is a dist store to MXNet's C++ create, async if it has "_async"
found["dist_sync_mpi"] = outcome(lambda: mx.kv.create("DIST_sync_mpi"))    # a ps store, but joint ranks only
found["dist_sync_device_x"] = [type(mx.kv.create("DIST_sync_device_x")).__module__,
                               mx.kv.create("dist_sync_device_x").type]
found["dist_device_async"] = outcome(lambda: mx.kv.create("dist_device_async"))
# command 0 is how MXNet's own set_optimizer reaches its servers: a pickled optimizer, as a str
kv.init("o", mx.nd.ones(2))
found["bad_command_0"] = outcome(lambda: kv._send_command_to_servers(0, "hello"))
found["command_5"] = outcome(lambda: kv._send_command_to_servers(5, ""))
kv._send_command_to_servers(0, pickle.dumps(mx.optimizer.SGD(learning_rate=0.5), 0).decode("latin-1"))
kv.push("o", mx.nd.ones(2))
o = mx.nd.zeros(2)
kv.pull("o", out=o)
found["after_command_0"] = o.asnumpy().tolist()
print("RESULT " + json.dumps(found), flush=True)
