"""--launcher sge and yarn against argv-recording fakes (tests/launcher/fakes) that then run
the tasks locally, so the job itself is real; the test checks argv and env exactly."""
from __future__ import annotations

import json
import os
import re

import pytest

from ps.horovod import HOROVOD_PATH
from ps.mxnet_autoload import MXNET_AUTOLOAD

from .launch_util import PY, ROOT, bash, poll_for, worker_cmd

pytestmark = [pytest.mark.process, pytest.mark.launcher]

FAKES = os.path.join(ROOT, "tests", "launcher", "fakes")


def records(d, prefix: str) -> list[dict]:
    files = sorted((f for f in os.listdir(d) if f.startswith(prefix + ".")), key=lambda f: int(f.split(".")[1]))
    return [json.load(open(os.path.join(d, f))) for f in files]


def fake_env(tmp_path, **extra) -> dict:
    rec = tmp_path / "record"
    rec.mkdir()
    # OMP_NUM_THREADS: forwarded to every task, as dmlc's tracker does (launcher/tracker.py)
    return {"PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_RECORD": str(rec), "PYTHONPATH": ROOT,
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "3", **extra}


def by_role(recs: list[dict], flag: str, value_of) -> dict:
    return {value_of(r["argv"][r["argv"].index(flag) + 1]): r for r in recs}


def test_sge_qsub_argv_env_and_job(launch, tmp_path):
    env = fake_env(tmp_path)
    logs = tmp_path / "logs"
    job = launch(["--launcher", "sge", "--host-ip", "127.0.0.1", "-n", "2", "-s", "1", "--log-dir", str(logs),
                  "--env-worker", "W_ONLY:x y", *worker_cmd()], env=env)
    assert job.wait(60) == 0, job.output
    assert sorted(job.matching("[worker ")) == ["[worker 0] rank=0 sum=3.0 task=1",
                                                "[worker 1] rank=1 sum=3.0 task=2"], job.output
    recs = by_role(records(env["FAKE_RECORD"], "qsub"), "-N", lambda n: n[3:])
    port = re.search(r"scheduler 127\.0\.0\.1:(\d+)", job.output).group(1)
    for role, n in (("server", 1), ("worker", 2)):
        names = ["PATH", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                 "DMLC_JOB_CLUSTER", "PYTHONUNBUFFERED", "DMLC_ROLE", "PS_TEST_JOB"]
        names = ["OMP_NUM_THREADS", "PYTHONPATH"] + names + (["W_ONLY"] if role == "worker" else [])
        assert recs[role]["argv"] == [
            "-sync", "y", "-terse", "-cwd", "-t", f"1-{n}", "-S", "/bin/sh", "-N", f"ps-{role}",
            "-o", f"{logs}/{role}.$TASK_ID.out", "-e", f"{logs}/{role}.$TASK_ID.err",
            "-v", ",".join(names), f"{logs}/{role}.sh"]
        got = recs[role]["env"]
        assert {k: got[k] for k in names if k not in ("PATH", "PS_TEST_JOB")} == {
            "OMP_NUM_THREADS": "3", "PYTHONPATH": f"{MXNET_AUTOLOAD}:{HOROVOD_PATH}:{ROOT}", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
            "DMLC_PS_ROOT_URI": "127.0.0.1",
            "DMLC_PS_ROOT_PORT": port, "DMLC_JOB_CLUSTER": "sge", "PYTHONUNBUFFERED": "1", "DMLC_ROLE": role,
            **({"W_ONLY": "x y"} if role == "worker" else {})}
    worker_script = (logs / "worker.sh").read_text()
    assert worker_script.startswith("#!/bin/sh\n/bin/sh -c ")
    assert worker_script.rstrip().endswith(f"ps-launch-rank {PY} {worker_cmd()[1]}")
    assert (logs / "server.sh").read_text().rstrip().endswith(f"ps-launch-rank {PY} -m ps")


def test_sge_task_failure_and_qdel(launch, tmp_path):
    env = fake_env(tmp_path)
    job = launch(["--launcher", "sge", "--host-ip", "127.0.0.1", "-n", "2", "-s", "1", "--log-dir",
                  str(tmp_path / "logs"), "--env", "PS_TEST_FAIL:1:4", *worker_cmd()], env=env)
    assert job.wait(60) == 4, job.output
    assert "[launcher] worker 1 exited with status 4: stopping the job" in job.lines
    qdel = (tmp_path / "record" / "qdel.txt").read_text().split()
    assert sorted(qdel) == ["4200", "4201"]  # both array jobs, by job id


def test_yarn_argv_env_and_job(launch, tmp_path):
    hadoop = tmp_path / "hadoop"
    jar_dir = hadoop / "share" / "hadoop" / "yarn"
    jar_dir.mkdir(parents=True)
    jar = jar_dir / "hadoop-yarn-applications-distributedshell-3.3.6.jar"
    jar.write_bytes(b"")
    env = fake_env(tmp_path, HADOOP_HOME=str(hadoop))
    work = tmp_path / "work"
    job = launch(["--launcher", "yarn", "--host-ip", "127.0.0.1", "-n", "2", "-s", "1", "--log-dir", str(work),
                  "--env-server", "S_ONLY:1", *worker_cmd()], env=env)
    assert job.wait(60) == 0, job.output
    assert sorted(ln.split("] ", 1)[1].split(" task=")[0] for ln in job.matching("[yarn workers] rank=")) == [
        "rank=0 sum=3.0", "rank=1 sum=3.0"], job.output
    port = re.search(r"scheduler 127\.0\.0\.1:(\d+)", job.output).group(1)
    recs = by_role(records(env["FAKE_RECORD"], "yarn"), "-appname", lambda n: n[3:])
    client = "org.apache.hadoop.yarn.applications.distributedshell.Client"
    for role, n in (("server", 1), ("worker", 2)):
        shell_env = {"OMP_NUM_THREADS": "3", "PYTHONPATH": f"{MXNET_AUTOLOAD}:{HOROVOD_PATH}:{ROOT}", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
                     "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": port, "DMLC_JOB_CLUSTER": "yarn",
                     "PYTHONUNBUFFERED": "1", "DMLC_ROLE": role, "PS_TEST_JOB": job.marker,
                     **({"S_ONLY": "1"} if role == "server" else {})}
        expected = ["jar", str(jar), client, "-jar", str(jar), "-appname", f"ps-{role}", "-num_containers", str(n),
                    "-container_memory", "1024", "-container_vcores", "1", "-timeout", str(365 * 24 * 3600 * 1000),
                    "-shell_script", f"{work}/{role}.sh"]
        for k, v in shell_env.items():
            expected += ["-shell_env", f"{k}={v}"]
        assert recs[role]["argv"] == expected
    assert (work / "server.sh").read_text() == f"#!/bin/sh\nexec {PY} -m ps\n"


def test_sge_real_gridengine(launch, sge, tmp_path):
    """A real qmaster + execd: array jobs, -v env, followed output, exit status, qdel."""
    env = {"SGE_ROOT": sge["SGE_ROOT"], "SGE_CELL": sge["SGE_CELL"], "PYTHONPATH": ROOT}
    job = launch(["--launcher", "sge", "--host-ip", "127.0.0.1", "-n", "2", "-s", "1", *worker_cmd()],
                 env=env, cwd=str(tmp_path))
    assert job.wait(90) == 0, job.output
    assert sorted(job.matching("[worker ")) == ["[worker 0] rank=0 sum=3.0 task=1",
                                                "[worker 1] rank=1 sum=3.0 task=2"], job.output
    assert os.listdir(tmp_path) == []  # the scratch directory is gone
    failing = launch(["--launcher", "sge", "--host-ip", "127.0.0.1", "-n", "2", "-s", "1",
                      "--env", "PS_TEST_FAIL:0:6", *worker_cmd()], env=env, cwd=str(tmp_path))
    assert failing.wait(90) == 6, failing.output
    assert "[launcher] worker 0 exited with status 6: stopping the job" in failing.lines

    def jobs_left() -> str:
        return bash("qstat -u '*'", env=env).stdout
    assert poll_for(lambda: "ps-" not in jobs_left(), 10), jobs_left()  # both array jobs deleted
