"""MXNet's error behaviour and row_sparse_pull results, from a plain MXNet script (no `import ps`)
run under `python -m ps.launch`: test_parity.py checks what it prints."""
import json

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
found["worker_profiling"] = outcome(lambda: mx.profiler.set_config(filename="w.json", profile_process="worker"))
print("RESULT " + json.dumps(found), flush=True)
