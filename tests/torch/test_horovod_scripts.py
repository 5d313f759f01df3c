"""Horovod scripts run on ps unchanged: ``import horovod.torch as hvd`` (or ``horovod.mxnet``)
finds ps's ``horovod`` package (ps/horovod), which ``python -m ps.launch`` puts on PYTHONPATH
and a bare mpirun gets from ``PYTHONPATH=$(python -m ps.horovod --path)``; ``PS_HOROVOD=0``
leaves it out."""
import os
import shutil
import subprocess

import pytest

from ps.horovod import HOROVOD_PATH
from tests.helpers import PYTHON, ROOT, cluster_env, free_port

from .test_torch import results

pytestmark = pytest.mark.process

pytest.importorskip("torch")

SCRIPT = str(ROOT / "tests" / "torch" / "hvd_benchmark.py")


def launched(procs, *argv, workers=2, **extra):
    """``python -m ps.launch -n workers -s 2 argv`` with no PYTHONPATH of ps's horovod: (code, output)."""
    env = cluster_env(0, OMP_NUM_THREADS="1", **extra)
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", str(workers), "-s", "2", "--launcher", "local", *argv],
                           env)
    code, out, err = procs.finish(launcher, timeout=150)
    return code, out + err


def check_benchmark(out):
    got = sorted(results(out), key=lambda g: g["rank"])
    assert [g["rank"] for g in got] == [0, 1] and {g["size"] for g in got} == {2}, out
    assert all(g["horovod"].startswith(HOROVOD_PATH) for g in got), got      # ps's package, not another
    assert got[0]["checksum"] == got[1]["checksum"], got     # broadcast, then the same averaged steps
    assert "Total img/sec on 2 CPU(s): " in out, out


@pytest.mark.timeout(200)
def test_a_horovod_benchmark_runs_unchanged_under_the_launcher(procs):
    code, out = launched(procs, PYTHON, SCRIPT, "--fp16-allreduce")
    assert code == 0, out
    check_benchmark(out)


@pytest.mark.timeout(200)
def test_a_horovod_benchmark_runs_unchanged_under_a_bare_mpirun():
    if not shutil.which("mpirun.openmpi"):
        pytest.skip("needs openmpi-bin")
    path = subprocess.run([PYTHON, "-m", "ps.horovod", "--path"], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()
    assert path == HOROVOD_PATH
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(PYTHONPATH=f"{path}:{ROOT}", DMLC_PS_ROOT_PORT=str(free_port()), OMP_NUM_THREADS="1",
               PS_MXNET_AUTOLOAD="0")
    proc = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "2", PYTHON, SCRIPT],
                          env=env, capture_output=True, text=True, timeout=150, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_benchmark(proc.stdout)


@pytest.mark.timeout(200)
def test_horovod_mxnet_under_the_launcher_and_the_opt_out(procs):
    pytest.importorskip("mxnet")
    code, out = launched(procs, PYTHON, "-c", "import os, mxnet as mx, horovod.mxnet as hvd; hvd.init(); "
                         "s = hvd.allreduce(mx.nd.array([hvd.rank() + 1.0]), average=False, name='x'); "
                         "os.write(1, f'SUM {hvd.rank()} {s.asscalar()} {hvd.__file__}\\n'.encode())")
    assert code == 0, out
    for r in (0, 1):
        assert f"SUM {r} 3.0 {os.path.join(HOROVOD_PATH, 'horovod', 'mxnet', '__init__.py')}" in out, out
    code, out = launched(procs, PYTHON, "-c", "import horovod", workers=1, PS_HOROVOD="0")
    assert code != 0 and "ModuleNotFoundError: No module named 'horovod'" in out, out
