"""ps.mxnet behaves as MXNet's own dist kvstore where MXNet's nightly tests look: MXNetError for
a key never initialized, ignore_sparse=False raises, row_sparse_pull rows deduplicated and
sorted, and server profiling refused with a clear message instead of a null-handle error."""
import json

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytest.importorskip("mxnet")


def test_errors_and_row_sparse_pull_as_mxnet(procs, tmp_path):
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "1", "-s", "1", "--launcher", "local",
                            PYTHON, str(ROOT / "tests" / "mxnet" / "parity_worker.py")], cluster_env(0), cwd=str(tmp_path))
    code, out, err = procs.finish(launcher, timeout=120)
    assert code == 0, out + err
    (line,) = [x for x in out.splitlines() if "RESULT " in x]
    found = json.loads(line.split("RESULT ", 1)[1])
    assert found["store"] == "ps.mxnet"
    assert found["uninitialized"].startswith("MXNetError: key 'nokey' is not initialized"), found
    assert found["push_uninitialized"].startswith("MXNetError: key 'nokey' is not initialized"), found
    assert found["ignore_sparse_false"].startswith("MXNetError: pull of key 'w' into a row_sparse array"), found
    assert found["ignore_sparse_true"] == "no error"
    assert found["rows"] == [1, 3] and found["data"] == [[2.0, 3.0], [6.0, 7.0]]
    assert found["empty_rows"] == []
    assert found["server_profiling"].startswith("MXNetError: ps servers do not run MXNet's profiler"), found
    assert found["worker_profiling"] == "no error"
