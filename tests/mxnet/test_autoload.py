"""Zero-edit MXNet scripts: under `python -m ps.launch`, a script that imports plain mxnet
gets ps's dist_sync kvstore (the launcher's PYTHONPATH hook), with single-process numbers."""
import json
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")

SCRIPT = str(ROOT / "tests" / "mxnet" / "plain_gluon.py")


def results(text):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]


def one_process(script, *flags):
    """The RESULT of ``script --local``: one process on both workers' batches."""
    ref = subprocess.run([PYTHON, script, "--local", *flags], capture_output=True, text=True, timeout=120,
                         env={**cluster_env(0), "PYTHONPATH": str(ROOT)}, check=False)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    (local,) = results(ref.stdout)
    return local


def test_an_unmodified_gluon_script_with_its_own_optimizer_trains_on_ps_with_single_process_numbers(procs):
    """An optimizer class the script defines: with no flag and no PS_SECRET_FILE the launcher's
    per-job secret lets the servers run it (pickled by value, signed). (MXNet's SGD:
    test_the_same_script_gives_native_mxnet_dist_sync_numbers.)"""
    env = cluster_env(0)
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            PYTHON, SCRIPT, "--own-optimizer"], env)
    code, out, err = procs.finish(launcher, timeout=120)
    assert code == 0, out + err
    workers = results(out)
    assert sorted(r["rank"] for r in workers) == [0, 1], out
    assert {r["kvstore"] for r in workers} == {"ps.mxnet.Dist_Sync"}, out
    local = one_process(SCRIPT, "--own-optimizer")
    for worker in workers:
        for name, values in local["weights"].items():
            np.testing.assert_allclose(worker["weights"][name], values, atol=1e-5, err_msg=name)


def test_a_module_script_with_its_own_optimizer_keeps_mxnets_per_parameter_weight_decay(procs):
    """Module keys the kvstore by parameter name and tells its optimizer which index is which
    name (``idx2name``): MXNet then gives biases no weight decay. The servers call the pickled
    optimizer with ps's keys (a name's hash), so those must be the indices it knows; before,
    the biases were decayed (2.8 % off at wd 0.01).

    With tight heartbeats: the first pickled optimizer makes a server import mxnet, which takes
    seconds. Done on its I/O thread it held back the heartbeats too, and with a tight
    PS_HEARTBEAT_TIMEOUT (or a busy machine and the default one) the scheduler declared the
    server dead."""
    script = str(ROOT / "tests" / "mxnet" / "plain_module.py")
    env = cluster_env(0, PS_HEARTBEAT_INTERVAL="0.2", PS_HEARTBEAT_TIMEOUT="1")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON, script],
                           env)
    code, out, err = procs.finish(launcher, timeout=120)
    assert code == 0 and "heartbeat" not in out + err, out + err
    workers = results(out)
    assert sorted(r["rank"] for r in workers) == [0, 1], out
    local = one_process(script)
    for worker in workers:
        for name, values in local["weights"].items():
            np.testing.assert_allclose(worker["weights"][name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_same_script_gives_native_mxnet_dist_sync_numbers(procs, port):
    """The target of the MXNet issue: 10 steps on ps (launcher) and on MXNet's own C++
    parameter server (its scheduler and servers are `python -c "import mxnet"`, as MXNet's
    manual start), the same unmodified script; every weight within 1e-5 of native's and of one
    process's on both workers' batches."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            PYTHON, SCRIPT], cluster_env(0))
    native_env = cluster_env(port, PS_MXNET_AUTOLOAD="0")
    native_env.pop("PYTHONPATH")
    mxnet_only = [PYTHON, "-c", "import mxnet"]
    others = [procs.start(mxnet_only, {**native_env, "DMLC_ROLE": role}) for role in ("scheduler", "server", "server")]
    workers = [procs.start([PYTHON, SCRIPT], {**native_env, "DMLC_ROLE": "worker"}) for _ in range(2)]
    native = []
    for w in workers:
        code, out, err = procs.finish(w, timeout=120)
        assert code == 0, out + err
        native += results(out)
    for p in others:
        assert procs.finish(p, timeout=30)[0] == 0
    assert {r["kvstore"] for r in native} == {"mxnet.kvstore.kvstore.KVStore"}, native
    code, out, err = procs.finish(launcher, timeout=120)
    assert code == 0, out + err
    ours = results(out)
    assert {r["kvstore"] for r in ours} == {"ps.mxnet.Dist_Sync"}, out
    assert sorted(r["rank"] for r in ours) == sorted(r["rank"] for r in native) == [0, 1]
    local = one_process(SCRIPT)
    for mine in ours:
        theirs = next(r for r in native if r["rank"] == mine["rank"])
        for name, values in theirs["weights"].items():
            np.testing.assert_allclose(mine["weights"][name], values, rtol=0, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(mine["weights"][name], local["weights"][name], atol=1e-5, err_msg=name)


def test_the_autoload_can_be_turned_off(procs):
    env = cluster_env(0, PS_MXNET_AUTOLOAD="0", PS_CONNECT_TIMEOUT="60")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "1", "-s", "1", "--launcher", "local",
                            PYTHON, SCRIPT], env)
    code, out, err = procs.finish(launcher, timeout=60)
    assert code != 0
    assert "native MXNet kvstore worker" in out + err, out + err


def test_by_hand_one_variable_puts_the_hook_in_place():
    path = subprocess.run([PYTHON, "-m", "ps", "--mxnet-autoload-path"], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT), check=True).stdout.strip()
    probe = ("import sys, mxnet; print('ps.mxnet' in sys.modules, "
             "type(mxnet.kv.create('local')).__module__)")
    out = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/",
                         env={**cluster_env(0), "PYTHONPATH": f"{path}:{ROOT}", "DMLC_ROLE": "worker"})
    assert out.stdout.split()[0] == "True", out.stdout + out.stderr


def test_by_hand_the_same_plain_script_serves_every_role(procs, port):
    """MXNet's manual start runs the training script in every role; with the hook on
    PYTHONPATH, its `import mxnet` runs ps's scheduler and servers instead of MXNet's."""
    path = subprocess.run([PYTHON, "-m", "ps", "--mxnet-autoload-path"], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT), check=True).stdout.strip()
    env = cluster_env(port, servers=1, workers=2, PYTHONPATH=f"{path}:{ROOT}")
    others = [procs.role("scheduler", env, SCRIPT), procs.role("server", env, SCRIPT)]
    workers = [procs.role("worker", env, SCRIPT) for _ in range(2)]
    outs = []
    for w in workers:
        code, out, err = procs.finish(w, timeout=120)
        assert code == 0, out + err
        outs += results(out)
    assert {r["kvstore"] for r in outs} == {"ps.mxnet.Dist_Sync"}
    for p in others:
        assert procs.finish(p, timeout=30)[0] == 0
