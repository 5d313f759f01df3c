"""Unmodified MXNet scripts with row_sparse parameters train on ps with MXNet's numbers:
Gluon (row_sparse embedding, lazy SGD with momentum and wd, plus a dense layer) and
Module (CSR data, row_sparse weight, lazy Adam), in dist_sync with 2 workers and 2 servers
and in dist_async, against the same script in one process on MXNet's local kvstore."""
import json
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")

SCRIPT = str(ROOT / "tests" / "mxnet" / "plain_sparse.py")


def results(text):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]


def local_reference(api, workers):
    env = {**cluster_env(0), "PYTHONPATH": str(ROOT), "SPARSE_WORKERS": str(workers)}
    ref = subprocess.run([PYTHON, SCRIPT, api, "local"], capture_output=True, text=True, timeout=120, env=env)
    assert ref.returncode == 0, ref.stderr
    (local,) = results(ref.stdout)
    return local["weights"]


# each API and each kind once (the two APIs differ in how they pull rows, the kinds in the servers)
@pytest.mark.parametrize("api,kind,workers", [("gluon", "dist_sync", 2), ("module", "dist_async", 1)])
def test_sparse_training_matches_mxnet(procs, api, kind, workers):
    env = cluster_env(0, SPARSE_WORKERS=str(workers))
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", str(workers), "-s", "2", "--launcher", "local",
                            PYTHON, SCRIPT, api, kind], env)
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    found = results(out)
    assert sorted(r["rank"] for r in found) == list(range(workers)), out
    assert {r["kvstore"] for r in found} == {f"ps.mxnet.{kind.title()}"}, out
    expected = local_reference(api, workers)
    for worker in found:
        for name, values in expected.items():
            np.testing.assert_allclose(worker["weights"][name], values, rtol=1e-5, atol=1e-6, err_msg=name)
    if api == "module":                   # trained, and lazily: rows no batch touched keep their 0.2
        w = np.asarray(expected["w"])
        assert 0 < np.count_nonzero(np.abs(w - 0.2) > 1e-6) < w.size
