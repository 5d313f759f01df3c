"""The README's first command: `bash examples/demo.sh` trains a network with 2 workers x 2
servers through the launcher's zero-edit path, shows progress, and compares with one process."""
import json
import os
import re
import subprocess
import urllib.request

import pytest

from tests.helpers import ROOT, read_until

pytestmark = pytest.mark.process


@pytest.mark.timeout(300)
def test_the_demo_trains_with_progress_and_a_summary():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "PYTHONPATH"))}
    res = subprocess.run(["bash", "examples/demo.sh", "--epochs", "3"], cwd=str(ROOT), env=env,
                         capture_output=True, text=True, timeout=280)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):             # one line per epoch per worker: loss, accuracy, samples/s
        epochs = re.findall(rf"^\[worker {rank}\] worker {rank}: epoch (\d)/3  loss \d+\.\d+  "
                            r"train accuracy \d\.\d+  [\d,]+ samples/s$", out, re.MULTILINE)
        assert epochs == ["1", "2", "3"], out
    assert not re.search(r"^\s*(import|from) ps", (ROOT / "examples" / "train_digits.py").read_text(), re.MULTILINE)
    assert " INFO " not in out, out                       # quiet by default
    m = re.search(r"^summary: test accuracy (\d\.\d+) with 2 workers x 2 servers on ps \(dist_sync\), "
                  r"(\d\.\d+) in one process", out, re.MULTILINE)
    assert m, out
    ours, one = float(m.group(1)), float(m.group(2))
    assert ours > 0.8 and abs(ours - one) <= 0.02, out    # it learned, as one process does
    assert re.search(r"step time \d+\.\d ms on ps, \d+\.\d ms in one process", out), out
    moved = float(re.search(r"(\d+\.\d+) MB moved per step by each worker", out).group(1))
    assert 0.13 < moved < 0.2, out                        # 2 x 17,258 float32 and a little meta
    assert re.search(r"^\[launcher\] worker 1 +exit 0 after \d+\.\ds$", out, re.MULTILINE), out


@pytest.mark.timeout(300)
def test_the_demo_with_a_dashboard_prints_a_url_that_shows_the_job(procs):
    """`bash examples/demo.sh --dashboard`: the URL it prints answers while the job trains."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "PYTHONPATH"))}
    proc = procs.start(["bash", "examples/demo.sh", "--dashboard=127.0.0.1:0", "--epochs", "8"], env,
                       stderr=subprocess.STDOUT)
    line = read_until(proc, lambda ln: ln.startswith("[launcher] dashboard: http://"), 240, "the dashboard's URL")
    url = line.split()[2]
    read_until(proc, lambda ln: "epoch 1/8" in ln, 120, "the first epoch")
    with urllib.request.urlopen(url + "api/nodes", timeout=10) as r:
        nodes = json.loads(r.read())
    assert sorted((n["role"], n["rank"]) for n in nodes) == [("server", 0), ("server", 1), ("worker", 0),
                                                             ("worker", 1)]
    code, out, _ = procs.finish(proc, 240)
    assert code == 0, out
