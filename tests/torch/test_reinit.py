"""``hvd.init()`` after ``hvd.shutdown()`` in one process joins the job again (ps/collective/job.py
keeps the store for it), under ps's launcher and under a bare mpirun: real workers, and every
session's numbers checked."""
import os
import shutil
import subprocess

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env, free_port

from .test_torch import launch, results

pytestmark = pytest.mark.process

pytest.importorskip("torch")

SCRIPT = str(ROOT / "tests" / "torch" / "reinit_worker.py")
N = 2


def check(got):
    assert sorted(g["rank"] for g in got) == list(range(N)), got
    for g in got:
        r = g["rank"]
        assert g["who"] == [[r, N, True]] * 3, g                     # the same rank every session
        assert g["sum"] == [3.0, 6.0, 9.0], g                        # (1 + 2) x session
        assert g["bcast"] == [0.0, 11.0, 2.0], g                     # root i % 2 sends 10 x root + i
        assert g["gather"] == [[float(i)] * 3 for i in range(3)], g  # rank 0's one row, rank 1's two
        assert g["grad"] == [[1.5 * (i + 1)] * 2 for i in range(3)], g
        assert g["set"] == ([[1, 1.0], [2, 2.0], [3, 3.0]] if r == N - 1 else []), g
        assert g["after"] == [False] * 3 and len(g["rank_after"]) == 3, g
        assert "ps.torch.init() has not been called" in g["rank_after"][0], g
        assert "init(kvstore='dist_async') after shutdown(): this process's job runs 'dist_sync'" in g["mode"], g
        assert g["last"] == 2.0, g


@pytest.mark.timeout(200)
def test_init_after_shutdown_joins_again_under_the_launcher(procs):
    check(results(launch(procs, script=SCRIPT, workers=N)))


@pytest.mark.timeout(200)
def test_init_after_shutdown_joins_again_under_a_bare_mpirun():
    if not shutil.which("mpirun.openmpi"):
        pytest.skip("needs openmpi-bin")
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(DMLC_PS_ROOT_PORT=str(free_port()), PS_CONNECT_TIMEOUT="60", PS_MXNET_AUTOLOAD="0")
    proc = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(N), PYTHON, SCRIPT],
                          env=env, capture_output=True, text=True, timeout=150, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check(results(proc.stdout))


@pytest.mark.timeout(200)
def test_a_call_left_in_flight_at_shutdown_is_named_and_the_next_init_still_joins(procs):
    """Rank 0 starts an allreduce no other rank makes: shutdown() waits PS_REQUEST_TIMEOUT for
    it, names it, and keeps the store, so the next session's numbers still come out right."""
    code = ("import os, time, torch, ps.torch as hvd\n"
            "hvd.init()\n"
            "if hvd.rank() == 0:\n    hvd.allreduce_async(torch.ones(2), name='orphan')\n"
            "hvd.shutdown()\n"
            "hvd.init()\n"
            "if hvd.rank() == 1:\n    time.sleep(4)\n"       # its next call waits 3s at most: let rank 0 settle
            "s = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), name='x', op=hvd.Sum).item()\n"
            "os.write(1, f'RESULT {{\"rank\": {hvd.rank()}, \"sum\": {s}}}\\n'.encode())\n")
    out = launch(procs, code, script="-c", PS_REQUEST_TIMEOUT="3")
    assert sorted((g["rank"], g["sum"]) for g in results(out)) == [(0, 3.0), (1, 3.0)], out
    named = [ln for ln in out.splitlines() if "shutdown: a call is still in flight after 3s and is left to finish "
             "later: pushpull of key" in ln]
    assert len(named) == 1 and named[0].startswith("[worker 0]") and "allreduce.orphan" in named[0], out
