"""--launcher local against the real ps core: results, prefixes, exit status, stopping."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time

import psutil
import pytest

from ps.horovod import HOROVOD_PATH
from ps.mxnet_autoload import MXNET_AUTOLOAD

from .launch_util import PY, ROOT, marked_pids, poll_for, worker_cmd

pytestmark = pytest.mark.process


def ranks_ok(lines: list[str]) -> dict[int, str]:
    """{rank: sum} from '[worker r] rank=r sum=...' lines; asserts prefix == kv.rank."""
    out = {}
    for line in lines:
        m = re.match(r"^\[worker (\d+)\] rank=(\d+) sum=(\S+)", line)
        if m:
            assert m.group(1) == m.group(2), line
            out[int(m.group(1))] = m.group(3)
    return out


def test_numpy_example_2x2(launch):
    job = launch(["-n", "2", "-s", "2", "--launcher", "local", PY, "examples/numpy_sync.py"])
    assert job.wait(60) == 0, job.output
    lines = job.matching("[worker ")
    assert sorted(lines) == [
        "[worker 0] worker 0/2: key 3 = 3 (expected 3), sharded key ok = True",
        "[worker 1] worker 1/2: key 3 = 3 (expected 3), sharded key ok = True"], job.output
    assert re.search(r"^\[launcher\] 2 servers, 2 workers on 1 host; scheduler 127\.0\.0\.1:\d+$",
                     job.output, re.MULTILINE), job.output
    ends = [ln for ln in job.lines if re.match(r"^\[launcher\] \S+( \d)? +exit", ln)]
    assert [ln.split()[1:3] for ln in ends] == [["scheduler", "exit"], ["server", "0"], ["server", "1"],
                                                 ["worker", "0"], ["worker", "1"]], job.output
    for line in ends:                  # one line per process: its status and wall time, at the end
        assert re.search(r"exit 0 after \d+\.\d+s$", line), line
    assert job.lines[-len(ends):] == ends, job.output


def test_prefixes_match_rank_and_env_per_role(launch, tmp_path):
    job = launch(["-n", "3", "-s", "2", "--log-dir", str(tmp_path),
                  "--env", "PS_TEST_SHOW:ALL_ROLES,SRV_ONLY,WRK_ONLY,DMLC_TASK_ID,DMLC_ROLE",
                  "--env", "ALL_ROLES:a b 'c' \"d\" $HOME", "--env-server", "SRV_ONLY:1",
                  "--env-worker", "WRK_ONLY:x:y", *worker_cmd()])
    assert job.wait(60) == 0, job.output
    assert ranks_ok(job.lines) == {0: "6.0", 1: "6.0", 2: "6.0"}, job.output
    for r in range(3):
        mine = job.matching(f"[worker {r}] env ")
        assert mine == [f"[worker {r}] env ALL_ROLES='a b \\'c\\' \"d\" $HOME'",
                        f"[worker {r}] env SRV_ONLY=None",
                        f"[worker {r}] env WRK_ONLY='x:y'",
                        f"[worker {r}] env DMLC_TASK_ID='{2 + r}'",
                        f"[worker {r}] env DMLC_ROLE='worker'"], job.output
        log = (tmp_path / f"worker-{r}.log").read_text()
        assert f"rank={r} sum=6.0" in log
    assert sorted(os.listdir(tmp_path)) == ["launcher.log", "worker-0.log", "worker-1.log", "worker-2.log"]


def test_worker_exit_status_stops_the_job(launch):
    t0 = time.monotonic()
    job = launch(["-n", "2", "-s", "2", "--env", "PS_TEST_FAIL:1:3", *worker_cmd()])
    assert job.wait(30) == 3, job.output
    assert time.monotonic() - t0 < 15
    assert "[worker 1] rank=1 failing" in job.lines
    assert "[launcher] worker 1 exited with status 3: stopping the job" in job.lines
    assert any(re.match(r"^\[launcher\] worker 1 +exit 3 after \d+\.\ds$", ln) for ln in job.lines), job.output
    assert any(re.match(r"^\[launcher\] server 0 +(stopped by the launcher \(status \d+\)|exit 1) after", ln)
               for ln in job.lines), job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def test_a_worker_that_ends_before_the_cluster_formed_ends_the_job_at_once(launch):
    """Rank 1's script takes a path that never creates the store: the others would wait for it
    until PS_CONNECT_TIMEOUT (here 60 s); the launcher names it and stops the job instead."""
    script = "import os, sys\nif os.environ['DMLC_RANK'] == '1': sys.exit(0)\nimport time; time.sleep(60)\n"
    t0 = time.monotonic()
    job = launch(["-n", "3", "-s", "1", "--env", "PS_CONNECT_TIMEOUT:60", PY, "-c", script])
    assert job.wait(30) == 1, job.output
    assert time.monotonic() - t0 < 20
    assert "[launcher] worker 1 exited with status 0 before the cluster formed (its script ended without " \
           "creating a dist kvstore): the job cannot form without it; stopping the job" in job.lines, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def test_sigint_leaves_no_process(launch):
    job = launch(["-n", "2", "-s", "2", "--env", "PS_TEST_HANG:1", *worker_cmd()])
    job.wait_for(lambda j: j.ready() == 2)
    assert len(marked_pids(job.marker)) == 4  # 2 servers + 2 workers (the scheduler is in the launcher)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.wait(10) == 130, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10 - (time.monotonic() - t0)), marked_pids(job.marker)
    assert "[launcher] SIGINT: stopping the job" in job.lines


def test_a_launcher_killed_by_sigkill_leaves_no_process_for_long(launch):
    """kill -9 of the launcher (an OOM kill, a lost login session) takes the scheduler with
    it; the nodes notice its closed connection and exit within seconds, not PS_HEARTBEAT_TIMEOUT."""
    job = launch(["-n", "2", "-s", "2", "--env", "PS_TEST_HANG:1", "--env", "PS_HEARTBEAT_TIMEOUT:60",
                  *worker_cmd()])
    job.wait_for(lambda j: j.ready() == 2)
    assert len(marked_pids(job.marker)) == 4
    os.kill(job.proc.pid, signal.SIGKILL)
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def _job_process(marker: str, role: str, rank: int) -> psutil.Process | None:
    for pid in marked_pids(marker):
        try:
            env = psutil.Process(pid).environ()
        except psutil.Error:
            continue
        if env.get("DMLC_ROLE") == role and env.get("DMLC_RANK") == str(rank):
            return psutil.Process(pid)
    return None


@pytest.mark.parametrize("restarts", ["0", "2"])
def test_a_server_killed_after_every_worker_finished_does_not_fail_the_job(launch, tmp_path, restarts):
    """A server SIGKILLed while the job shuts down (every worker exited 0, and it had not yet
    acknowledged the end) loses nothing: the job exits 0 and says why, and nothing restarts.
    Before, the job failed with the server's 137 (or, with restarts, waited for a restart)."""
    go = tmp_path / "go"
    script = ("import os, time, numpy as np, ps\n"
              "kv = ps.KVStore('dist_sync')\n"
              "kv.init(3, np.zeros(4, np.float32))\n"
              "out = kv.pushpull(3, np.ones(4, np.float32))\n"
              "print('trained', out.tolist(), flush=True)\n"
              f"end = time.monotonic() + 60\n"
              f"while not os.path.exists({str(go)!r}) and time.monotonic() < end:\n"
              "    time.sleep(0.05)\n"
              "kv.close()\n")
    job = launch(["-n", "2", "-s", "2", "--max-restarts", restarts, PY, "-c", script])
    job.wait_for(lambda j: len([ln for ln in j.lines if "trained [2.0, 2.0, 2.0, 2.0]" in ln]) == 2)
    server = _job_process(job.marker, "server", 0)
    assert server is not None, job.output
    server.send_signal(signal.SIGSTOP)          # it cannot acknowledge the end of the job
    go.touch()
    assert poll_for(lambda: _job_process(job.marker, "worker", 0) is None
                    and _job_process(job.marker, "worker", 1) is None, 30), job.output
    time.sleep(0.5)                             # the launcher has seen both workers exit 0
    server.send_signal(signal.SIGKILL)
    assert job.wait(30) == 0, job.output
    assert "[launcher] server 0 was killed by SIGKILL after every worker had finished" in job.output, job.output
    assert "starting it again" not in job.output, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def test_sigterm_and_stray_children_are_killed(launch):
    """A worker that leaves a child in another process group behind: the sweep still gets it."""
    script = ("import os, subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
              "print('spawned', flush=True); time.sleep(600)")
    job = launch(["-n", "1", "-s", "1", PY, "-c", script])
    job.wait_for(lambda j: "[worker 0] spawned" in j.lines)
    assert poll_for(lambda: len(marked_pids(job.marker)) == 3, 5)  # server, worker, its child
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.wait(10) == 143, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 5), marked_pids(job.marker)


def test_timeout_and_dry_run(launch):
    job = launch(["-n", "1", "-s", "1", "--timeout", "1", PY, "-c", "import time; time.sleep(60)"])
    assert job.wait(15) == 124, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 5)
    dry = launch(["-n", "1", "--dry-run", PY, "train.py", "--lr", "0.1"], env={"PYTHONUNBUFFERED": "1"})
    assert dry.wait(15) == 0
    pythonpath = shlex.quote("PYTHONPATH=" + os.pathsep.join(
        p for p in (MXNET_AUTOLOAD, HOROVOD_PATH, os.environ.get("PYTHONPATH")) if p))
    # a PYTHONPATH the launcher inherits keeps its place in the environment, the first
    inherited = bool(os.environ.get("PYTHONPATH"))
    assert dry.matching("[worker 0] ") == [(
        f"[worker 0] env {pythonpath + ' ' if inherited else ''}DMLC_NUM_WORKER=1 DMLC_NUM_SERVER=1 "
        f"DMLC_PS_ROOT_URI=127.0.0.1 'DMLC_PS_ROOT_PORT=<port>' DMLC_JOB_CLUSTER=local "
        f"{'' if inherited else pythonpath + ' '}DMLC_ROLE=worker DMLC_TASK_ID=1 "
        f"DMLC_RANK=0 PS_TEST_JOB={dry.marker} {PY} train.py --lr 0.1")]
    assert dry.matching("[server 0] ")[0].endswith(f"{PY} -m ps")


def test_entry_points_run():
    """python -m launcher, python -m ps.launch and the installed ps-launch are the same CLI."""
    import subprocess
    commands = [[PY, "-m", "launcher"], [PY, "-m", "ps.launch"]]
    script = os.path.join(os.path.dirname(PY), "ps-launch")
    if os.path.exists(script):  # installed (pip install -e .): console_scripts entry point
        commands.append([script])
    for cmd in commands:
        res = subprocess.run([*cmd, "-n", "1", "--dry-run", "true"], cwd=ROOT, capture_output=True,
                             text=True, check=False, timeout=30)
        assert res.returncode == 0, (cmd, res.stderr)
        assert "[worker 0] " in res.stdout


@pytest.mark.parametrize("extra,has_key", [([], True), (["--no-auth"], False)])
def test_each_job_gets_its_own_signing_key_removed_at_the_end(launch, extra, has_key):
    """A 0600 key file in a 0700 folder of its own, the same for every process of the job,
    gone when the job ends; --no-auth gives none (docs/security.md)."""
    script = ("import os, stat, ps; kv = ps.KVStore('dist_sync'); p = os.environ.get('PS_JOB_KEY_FILE'); "
              "print('key', p, p and oct(stat.S_IMODE(os.stat(p).st_mode)), "
              "p and oct(stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode)), flush=True); kv.close()")
    job = launch(["-n", "2", "-s", "1", "--launcher", "local", *extra, PY, "-c", script])
    assert job.wait(60) == 0, job.output
    keys = {line.split("] ", 1)[1] for line in job.matching("[worker ")}
    assert len(keys) == 1, job.output                          # one key for the whole job
    (line,) = keys
    if not has_key:
        assert line == "key None None None", job.output
        return
    _, path, mode, folder_mode = line.split()
    assert (mode, folder_mode) == ("0o600", "0o700"), line
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_cluster_check_on_one_machine_and_its_bad_arguments(launch, tmp_path):
    """`python -m ps.check` as the job's command: every server -> worker path measured (all
    on one host here), the pushpull round timed; rank 0 reports. Bad options are named
    before any process joins a cluster."""
    out = tmp_path / "check.json"
    job = launch(["-n", "2", "-s", "2", "--launcher", "local", PY, "-m", "ps.check", "--mb", "4",
                  "--path-mb", "1", "--pings", "5", "--json", str(out)])
    assert job.wait(60) == 0, job.output
    found = json.loads(out.read_text())
    pairs = sorted((p["server"], p["worker"]) for p in found["paths"])
    assert pairs == [(0, 0), (0, 1), (1, 0), (1, 1)], found
    assert all(p["same_host"] and p["rtt_ms"] > 0 and p["mb_per_s"] > 0 for p in found["paths"]), found
    assert len(found["round_s"]) == 2 and min(found["round_s"]) > 0 and found["model_mb"] == 4.0, found
    assert len(job.matching("[worker 0] ps cluster check: 2 workers, 2 servers")) == 1, job.output
    assert not job.matching("[worker 1] ps cluster check"), job.output           # rank 0 reports
    bad = subprocess.run([PY, "-m", "ps.check", "--mb", "0"], capture_output=True, text=True, timeout=30,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert bad.returncode == 2 and "--mb must be > 0, got 0.0" in bad.stderr, bad.stderr


def test_a_worker_that_fails_after_closing_its_store_is_not_started_again(launch):
    """Under --max-restarts, a worker whose script raises after kv.close() (here: exits 3)
    has ended its part of the job: a restart would re-run a script the job counts as done and
    wait for a scheduler that is gone once the other workers finish (PS_CONNECT_TIMEOUT, 120 s).
    The job fails at once with the worker's status, as without restarts."""
    script = ("import sys, time, numpy as np, ps\n"
              "kv = ps.KVStore('dist_sync')\n"
              "kv.init(3, np.zeros(4, np.float32))\n"
              "kv.pushpull(3, np.ones(4, np.float32))\n"
              "if kv.rank == 0:\n"
              "    time.sleep(60)\n"       # still at work: the job is not ending
              "kv.close()\n"
              "sys.exit(3)\n")
    start = time.monotonic()
    job = launch(["-n", "2", "-s", "1", "--max-restarts", "2", PY, "-c", script])
    assert job.wait(30) == 3, job.output
    assert time.monotonic() - start < 25, job.output
    assert "worker 1 exited with status 3 after it closed its store: not started again" in job.output, job.output
    assert "starting it again" not in job.output, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)
