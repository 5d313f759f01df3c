"""Both adapters scale an allreduce as Horovod does (ps/collective/ops.py): two real jobs, one
through ``ps.torch`` and one through ``ps.mxnet``, run every op on int32 and float32 tensors
with prescale and postscale factors; each result must be Horovod's, so the two agree."""
import functools
import json

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

from .scale_worker import DTYPES, FACTORS, OPS, values

pytestmark = pytest.mark.process


pytest.importorskip("torch")
pytest.importorskip("mxnet")

SCRIPT = str(ROOT / "tests" / "collective" / "scale_worker.py")
N = 2


def results(text):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]


def horovod(op, dtype, pre, post):
    """Horovod's CPU allreduce (horovod/common/ops/mpi_operations.cc, MPIAllreduce::Execute;
    collective_operations.h, ScaleBufferCPUImpl): every rank's tensor is scaled in its own dtype
    (an integer times a double, truncated on the way back; a float32 times a float32), reduced
    in that dtype, and the result scaled the same way (Average: the postscale divided by the
    ranks first). Min, Max and Product are scaled like the sums."""
    def scale(a, factor):
        if a.dtype.kind == "i":
            return np.trunc(a.astype(np.float64) * factor).astype(a.dtype)
        return a * np.float32(factor)
    parts = [scale(values(r, dtype), pre) for r in range(N)]
    fold = {"Sum": np.add, "Average": np.add, "Min": np.minimum, "Max": np.maximum, "Product": np.multiply}[op]
    return scale(functools.reduce(fold, parts), post / N if op == "Average" else post)


@pytest.mark.timeout(200)
def test_both_adapters_scale_every_op_as_horovod_does_on_int_and_float_tensors(procs):
    jobs = {name: procs.start([PYTHON, "-m", "ps.launch", "-n", str(N), "-s", "1", "--launcher", "local", PYTHON,
                               SCRIPT, name], cluster_env(0, **extra))
            for name, extra in (("torch", {"PS_MXNET_AUTOLOAD": "0"}), ("mxnet", {}))}
    got = {}
    for name, proc in jobs.items():
        code, out, err = procs.finish(proc, timeout=150)
        assert code == 0, out + err
        got[name] = sorted(results(out), key=lambda g: g["rank"])
        assert [(g["rank"], g["size"]) for g in got[name]] == [(r, N) for r in range(N)], out + err
    for pre, post in FACTORS:
        for dtype in DTYPES:
            for op in OPS:
                case = f"{op} {dtype} {pre} {post}"
                want = [dtype, horovod(op, dtype, pre, post).tolist()]
                for name in ("torch", "mxnet"):
                    assert all(g[case] == want for g in got[name]), (name, case, want, [g[case] for g in got[name]])
    assert got["torch"] == got["mxnet"]
