"""An unmodified Gluon script under ``--max-restarts``: a worker and a server SIGKILLed
mid-training; the job ends with exactly the weights of a run nobody killed. The restarted
worker re-runs the script from step 0; the servers answer the steps its dead self did."""
import re

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")
SCRIPT = str(ROOT / "tests" / "mxnet" / "gluon_restart.py")


def run(procs, out, *kills, steps=160):
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            "--max-restarts", "2", PYTHON, SCRIPT, str(steps), str(out), *kills], cluster_env(0))
    code, stdout, stderr = procs.finish(launcher, timeout=150)
    assert code == 0, stdout + stderr
    return stdout + stderr


def load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f}


@pytest.mark.timeout(200)
def test_an_unmodified_gluon_script_survives_a_killed_worker_and_server(procs, tmp_path):
    """The script re-runs from step 0 (the servers answer what its dead self did); it can tell
    it was restarted and how far its dead self got (kv.restarted, kv.round)."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    run(procs, tmp_path / "ref")
    text = run(procs, tmp_path / "run", "worker:1:50", "server:0:110")
    restarted = re.search(r"RESTARTED rank 1 round (\d+)", text)
    assert restarted and 50 <= int(restarted.group(1)) <= 53, text
    assert "worker 1 was killed by SIGKILL: starting it again (restart 1 of 2)" in text, text
    assert "server 0 was killed by SIGKILL: starting it again (restart 2 of 2)" in text, text
    ref = load(tmp_path / "ref" / "w0.npz")
    for rank in (0, 1):
        got = load(tmp_path / "run" / f"w{rank}.npz")
        for key, value in ref.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {rank} {key}")


@pytest.mark.timeout(200)
def test_an_unmodified_module_script_survives_a_killed_worker(procs, tmp_path):
    """Module pushes gradients and pulls weights apart: the restart's replayed pulls ask for the
    round they follow (Entry.seq) and its first new gradients come from its dead self's weights."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    run(procs, tmp_path / "ref", "--module", steps=80)
    text = run(procs, tmp_path / "run", "--module", "worker:1:40", steps=80)
    restarted = re.search(r"RESTARTED rank 1 round (\d+)", text)
    assert restarted and 40 <= int(restarted.group(1)) <= 43, text
    ref = load(tmp_path / "ref" / "w0.npz")
    assert len(ref) == 4, ref.keys()                 # fc1 and fc2, weight and bias
    for rank in (0, 1):
        got = load(tmp_path / "run" / f"w{rank}.npz")
        for key, value in ref.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {rank} {key}")


@pytest.mark.timeout(200)
def test_a_restarted_worker_whose_weights_live_on_the_workers_stops_the_job_with_the_reason(procs, tmp_path):
    """update_on_kvstore=False (here MXNet's own MXNET_UPDATE_ON_KVSTORE=0): the servers only sum,
    so what they hold is the last round's sum, not weights. A restarted worker re-running the
    script cannot be given its dead self's rounds: it is refused by name and the job stops.
    Before: exit 0 with every worker's weights off (by 2.5 and 5.5 here)."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            "--max-restarts", "2", PYTHON, SCRIPT, "160", str(tmp_path), "worker:1:50"],
                           cluster_env(0, MXNET_UPDATE_ON_KVSTORE="0"))
    code, out, err = procs.finish(launcher, timeout=150)
    text = out + err
    assert code != 0, text
    assert "worker 1 was killed by SIGKILL: starting it again (restart 1 of 2)" in text, text
    assert re.search(r"worker 1 \(W\[11\]\) was restarted and re-runs its script, but key \d+ has no optimizer on "
                     r"the servers: its value is the sum of round \d+, not weights", text), text
    assert "stopping the job" in text, text
