"""ps.mxnet behaves as MXNet's own dist kvstore where MXNet's nightly tests look: MXNetError for
a key never initialized, ignore_sparse=False raises, row_sparse_pull rows deduplicated and
sorted, and server profiling reaching ps's servers instead of a null-handle error;
every "dist" name MXNet accepts, and its set-the-optimizer server command, on ps."""
import json

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


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
    assert found["server_profiling"] == "no error", found     # MXNet: "KVStoreHandle passed to profiler is null"
    assert found["server_profiling_path"].startswith("RemoteError: server command 'profiler': server 0 "), found
    assert "profiler filename '../s.json'" in found["server_profiling_path"], found
    assert found["worker_profiling"] == "no error"
    assert found["none_key"] == "TypeError: keys must be int or str, got NoneType None", found
    # MXNet's C++ create would have started its own ps-lite worker for these names
    assert found["dist_sync_device_x"] == ["ps.mxnet", "dist_sync_device_x"], found
    assert found["dist_sync_mpi"].startswith("ConfigError: kvstore 'dist_sync_mpi' runs on joint ranks, but this "
                                             "process is a worker (DMLC_ROLE=worker)"), found
    assert found["dist_device_async"] == ("ValueError: this process already joined the cluster as "
                                          "'dist_sync'; cannot also create 'dist_device_async'"), found
    assert found["bad_command_0"].startswith("MXNetError: server command 0 (set the optimizer) needs a "
                                             "pickled mx.optimizer.Optimizer as its body; unpickling 'hello'"), found
    assert found["command_5"].startswith("MXNetError: ps servers take no MXNet server command 5"), found
    assert found["after_command_0"] == [0.5, 0.5], found    # 1 - 0.5 * 1: SGD ran on the servers
