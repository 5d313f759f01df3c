"""A pushpull that failed inside MXNet's engine reaches the script, as MXNet's own engine
errors do: at ``mx.nd.waitall()``, and, if the script never looks, in its exit status."""
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")
SCRIPT = str(ROOT / "tests" / "mxnet" / "engine_failure.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["waitall", "exit", "exit-import-ps"])
def test_a_pushpull_that_failed_in_the_engine_fails_the_worker(procs, mode):
    """Before, worker 0 printed DONE and exited 0 on weights its failed pushpulls never
    updated (the errors only logged, then once more at exit). ``exit-import-ps``: without the
    launcher's import hook (PS_MXNET_AUTOLOAD=0), the script imports ps.mxnet itself."""
    args, env = [mode], cluster_env(0)
    if mode == "exit-import-ps":
        args, env = ["exit", "--import-ps"], {**env, "PS_MXNET_AUTOLOAD": "0"}
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "1", "--launcher", "local",
                            PYTHON, SCRIPT, *args], env)
    code, out, err = procs.finish(launcher, timeout=100)
    text = out + err
    assert code == 1, text
    assert "worker 0 queued every step" in text and "worker 1 leaves" in text, text
    assert "closed its store without pushing" in text, text
    if mode == "waitall":
        assert "worker 0 DONE" not in text, text
        assert "in waitall" in text and "PeerLostError" in text, text      # raised at the script's wait
    else:
        assert "worker 0 DONE" in text, text
        assert "exiting with status 1: 1 pushpull error(s) the script never saw" in text, text
    assert "[launcher] worker 0 exited with status 1: stopping the job" in text, text
