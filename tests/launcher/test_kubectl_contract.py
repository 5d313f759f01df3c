"""--launcher kubernetes against a fake kubectl (tests/launcher/fakes/kubectl, first on PATH):
the real launcher as a subprocess, every kubectl call it makes recorded (argv, stdin) and
answered from a scenario: the submission and its order, owners carrying the root's uid, a
log follower per pod instance, the end from the Jobs' conditions, SIGINT, --detach, an
older cluster, no kubectl at all. No cluster is involved; docs/kubernetes.md says what
these tests cannot show."""
from __future__ import annotations

import base64
import json
import os
import signal
import uuid

import pytest

from .launch_util import ROOT, poll_for

pytestmark = pytest.mark.process

FAKES = os.path.join(ROOT, "tests", "launcher", "fakes")
UID = "6f1c1d2e-0000-4000-8000-00000000abcd"
RUNNING = "Running"


def pod(name, role, index, phase=RUNNING, uid=None, exit_code=None, message="", reason="Error"):
    status = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {
            "exitCode": exit_code, "reason": reason if exit_code else "Completed", "message": message,
            "finishedAt": "2026-01-01T00:00:09Z"}}}]
    return {"kind": "Pod", "metadata": {"name": name, "uid": uid or f"uid-{name}",
                                        "labels": {"ps-job": "ps-t", "ps-role": role},
                                        "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "status": status}


def job(role, kind=None, reason="", message=""):
    conditions = [{"type": kind, "status": "True", "reason": reason, "message": message}] if kind else []
    return {"kind": "Job", "metadata": {"name": f"ps-t-{role}"}, "status": {"conditions": conditions}}


def jobs(kind=None):
    return [job(r, kind) for r in ("scheduler", "server", "worker")]


def running(workers=2):
    return [pod("ps-t-scheduler-0-a", "scheduler", 0), pod("ps-t-server-0-a", "server", 0),
            *[pod(f"ps-t-worker-{i}-a", "worker", i) for i in range(workers)]]


def done(workers=2):
    return [pod("ps-t-scheduler-0-a", "scheduler", 0, "Succeeded", exit_code=0),
            pod("ps-t-server-0-a", "server", 0, "Succeeded", exit_code=0),
            *[pod(f"ps-t-worker-{i}-a", "worker", i, "Succeeded", exit_code=0) for i in range(workers)]]


class FakeCluster:
    """A scenario for the fake kubectl, and what it recorded."""

    def __init__(self, tmp_path, launch):
        self.record = tmp_path / "calls"
        self.record.mkdir()
        self.path = tmp_path / "scenario.json"
        self._launch = launch

    def scenario(self, **kw):
        kw.setdefault("version", {"serverVersion": {"major": "1", "minor": "31"}})
        kw.setdefault("namespace", "team-a")
        kw.setdefault("uid", UID)
        kw.setdefault("snapshots", [jobs() + running(), jobs("Complete") + done()])
        self.path.write_text(json.dumps(kw))

    def launch(self, *args, path=None):
        marker = uuid.uuid4().hex
        env = {"PATH": path if path is not None else f"{FAKES}{os.pathsep}{os.environ['PATH']}",
               "FAKE_RECORD": str(self.record), "FAKE_SCENARIO": str(self.path), "PS_TEST_JOB": marker}
        return self._launch(["--launcher", "kubernetes", "--image", "python:3.11", "--job-name", "ps-t", *args],
                            env=env, marker=marker)

    def calls(self):
        """Every call recorded so far, in the order they started. A call's file is claimed
        (created empty) when it starts and written in one go once it has its stdin: an empty
        one is a call still starting, left out until it is written."""
        files = sorted(self.record.glob("kubectl.*.json"), key=lambda p: int(p.name.split(".")[1]))
        return [json.loads(text) for text in (p.read_text() for p in files) if text]

    def verbs(self):
        return [c["argv"][2] if c["argv"][:1] == ["--namespace"] else c["argv"][0] for c in self.calls()]

    def created(self):
        return [json.loads(c["stdin"]) for c in self.calls() if "create" in c["argv"]]


@pytest.fixture
def cluster(tmp_path, launch):
    return FakeCluster(tmp_path, launch)


def test_submission_root_first_then_the_rest_owned_by_its_uid_and_exit_0_on_complete(cluster):
    cluster.scenario(logs={"ps-t-worker-0-a": ["hello from worker 0"], "ps-t-worker-1-a": ["hello from worker 1"],
                           "ps-t-server-0-a": ["serving"], "ps-t-scheduler-0-a": ["scheduling"]},
                     snapshots=[jobs() + running()[:3] + [pod("ps-t-worker-1-a", "worker", 1, "Pending")],
                                jobs() + running(), jobs("Complete") + done()])
    job = cluster.launch("-n", "2", "-s", "1", "--max-restarts", "2", "python", "train.py")
    assert job.wait(60) == 0, job.output
    calls = cluster.calls()
    assert cluster.verbs()[:3] == ["version", "config", "create"]
    assert all(c["argv"][:2] == ["--namespace", "team-a"] for c in calls[2:]), calls
    made = cluster.created()
    assert [(o["kind"], o["metadata"]["name"]) for o in made] == [
        ("Job", "ps-t-scheduler"), ("Secret", "ps-t-ps"), ("Service", "ps-t-scheduler"), ("Service", "ps-t"),
        ("Job", "ps-t-server"), ("Job", "ps-t-worker")]
    assert "ownerReferences" not in made[0]["metadata"]
    for obj in made[1:]:
        assert [(o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [("ps-t-scheduler", UID)]
        assert obj["metadata"]["namespace"] == "team-a"
    worker_env = {e["name"]: e.get("value") for e in made[-1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert worker_env["DMLC_PS_ROOT_URI"] == "ps-t-scheduler.team-a.svc"
    key = base64.b64decode(made[1]["data"]["job.key"]).decode()
    assert not any(key in arg for c in calls for arg in c["argv"])      # the key travels on stdin only
    for line in ("[worker 0] hello from worker 0", "[worker 1] hello from worker 1", "[server 0] serving",
                 "[scheduler] scheduling", "[launcher] job ps-t complete"):
        assert line in job.lines, job.output
    followed = sorted(c["argv"][-1] for c in calls if "logs" in c["argv"])
    assert followed == ["ps-t-scheduler-0-a", "ps-t-server-0-a", "ps-t-worker-0-a", "ps-t-worker-1-a"]
    assert "delete" not in cluster.verbs()


def test_a_replacement_pod_gets_a_log_follower_of_its_own(cluster):
    first = pod("ps-t-worker-0-a", "worker", 0)
    failed = pod("ps-t-worker-0-a", "worker", 0, "Failed", exit_code=137, reason="Error")
    second = pod("ps-t-worker-0-b", "worker", 0)
    cluster.scenario(logs={"ps-t-worker-0-a": ["attempt 1"], "ps-t-worker-0-b": ["attempt 2"]},
                     snapshots=[jobs() + running(0) + [first],
                                jobs() + running(0) + [failed, second],
                                jobs("Complete") + done(0)
                                + [failed, pod("ps-t-worker-0-b", "worker", 0, "Succeeded", exit_code=0)]])
    job = cluster.launch("-n", "1", "-s", "1", "--namespace", "ns1", "--max-restarts", "1", "python", "t.py")
    assert job.wait(60) == 0, job.output
    assert "[worker 0] attempt 1" in job.lines and "[worker 0] attempt 2" in job.lines, job.output
    assert "[launcher] worker 0: pod ps-t-worker-0-b replaces ps-t-worker-0-a (replacement 1)" in job.lines
    assert any("worker 0: pod ps-t-worker-0-a exit 137 (Error)" in ln for ln in job.lines), job.output
    followed = [c["argv"][-1] for c in cluster.calls() if "logs" in c["argv"]]
    assert followed.count("ps-t-worker-0-a") == 1 and followed.count("ps-t-worker-0-b") == 1
    assert cluster.verbs()[:2] == ["version", "create"]          # --namespace given: no context lookup


@pytest.mark.parametrize("reason, message, code, text", [
    ("PodFailurePolicy", ("Container worker for pod ns1/ps-t-worker-1-a failed with exit code 78 matching "
                          "FailJob rule at index 1"), 78, "ps: DMLC_NUM_WORKER must be >= 1, got '0'"),
    ("BackoffLimitExceeded", "Job has reached the specified backoff limit", 1, "RuntimeError: boom"),
    ("FailedIndexes", "Job has failed indexes", 137, "killed"),
])
def test_a_failed_job_names_its_reason_and_the_pods_termination_message_and_deletes_the_job(
        cluster, reason, message, code, text):
    dead = pod("ps-t-worker-1-a", "worker", 1, "Failed", uid="w1", exit_code=code, message=f"step 3\n{text}")
    cluster.scenario(snapshots=[jobs() + running(),
                                [job("scheduler"), job("server"), job("worker", "Failed", reason, message)]
                                + running(1) + [dead]])
    job_ = cluster.launch("-n", "2", "-s", "1", "--namespace", "ns1", "--max-restarts", "2", "python", "t.py")
    assert job_.wait(60) == code, job_.output
    assert f"[launcher] job/ps-t-worker failed: {reason}: {message}" in job_.lines, job_.output
    assert f"[launcher] worker 1:   {text}" in job_.lines, job_.output
    deletes = [c["argv"] for c in cluster.calls() if "delete" in c["argv"]]
    assert deletes and deletes[0][:6] == ["--namespace", "ns1", "delete", "job", "ps-t-scheduler", "--cascade=foreground"]


def test_sigint_deletes_the_job_in_the_foreground_and_a_second_one_exits_at_once(cluster):
    cluster.scenario(logs={"ps-t-worker-0-a": ["step 1"]}, hold=[p["metadata"]["name"] for p in running()],
                     snapshots=[jobs() + running()], delete_sleep=30)
    job = cluster.launch("-n", "2", "-s", "1", "--namespace", "ns1", "python", "t.py")
    job.wait_for(lambda j: "[worker 0] step 1" in j.lines, 30)
    job.proc.send_signal(signal.SIGINT)
    assert poll_for(lambda: "delete" in cluster.verbs(), 15), job.output
    deleting = next(c["argv"] for c in cluster.calls() if "delete" in c["argv"])
    assert deleting[2:6] == ["delete", "job", "ps-t-scheduler", "--cascade=foreground"]
    job.proc.send_signal(signal.SIGINT)           # the fake's delete takes 30 s: do not wait for it
    assert job.wait(10) == 130, job.output
    assert any("second signal: exiting now" in ln for ln in job.lines), job.output


def test_sigint_waits_for_the_deletion(cluster):
    cluster.scenario(hold=[p["metadata"]["name"] for p in running()], snapshots=[jobs() + running()], delete_sleep=1)
    job = cluster.launch("-n", "2", "-s", "1", "--namespace", "ns1", "python", "t.py")
    job.wait_for(lambda j: len([c for c in cluster.calls() if "logs" in c["argv"]]) == 4, 30)
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(30) == 130, job.output
    assert "[launcher] job ps-t deleted" in job.lines, job.output


def test_detach_prints_how_to_follow_and_delete_and_exits(cluster):
    cluster.scenario()
    job = cluster.launch("-n", "2", "-s", "2", "--detach", "python", "t.py")
    assert job.wait(30) == 0, job.output
    assert "follow: kubectl --namespace team-a logs -f -l ps-job=ps-t --prefix --max-log-requests=5" in job.lines
    assert "delete: kubectl --namespace team-a delete job ps-t-scheduler --cascade=foreground" in job.lines
    assert "get" not in cluster.verbs() and "logs" not in cluster.verbs()
    assert len(cluster.created()) == 6


def test_an_older_cluster_gets_the_fallback_and_one_warning(cluster):
    cluster.scenario(version={"serverVersion": {"major": "1", "minor": "27+", "gitVersion": "v1.27.16-gke.1"}})
    job = cluster.launch("-n", "3", "-s", "2", "--max-restarts", "2", "--detach", "python", "t.py")
    assert job.wait(30) == 0, job.output
    warnings = [ln for ln in job.lines if "Kubernetes 1.27 has no per-pod restart limit" in ln]
    assert len(warnings) == 1, job.output
    made = {o["metadata"]["name"]: o["spec"] for o in cluster.created() if o["kind"] == "Job"}
    assert [made[f"ps-t-{r}"]["backoffLimit"] for r in ("scheduler", "server", "worker")] == [2, 4, 6]
    assert not any("backoffLimitPerIndex" in s or "podReplacementPolicy" in s for s in made.values())
    assert all(s["podFailurePolicy"]["rules"][1]["onPodConditions"] == [] for s in made.values())


def test_no_kubectl_on_path_is_a_clear_error(cluster, tmp_path):
    cluster.scenario()
    job = cluster.launch("-n", "1", "python", "t.py", path=str(tmp_path))
    assert job.wait(30) == 1, job.output
    assert any("kubectl is not on PATH" in ln for ln in job.lines), job.output
    assert cluster.calls() == []


def test_an_unreachable_cluster_or_a_refused_create_fails_the_launch_cleanly(cluster):
    cluster.scenario(version_error="The connection to the server localhost:8080 was refused")
    job = cluster.launch("-n", "1", "python", "t.py")
    assert job.wait(30) == 1, job.output
    assert any("`kubectl version --request-timeout=20s -o json` failed: The connection to the server localhost:8080 "
               "was refused" in ln for ln in job.lines), job.output
    cluster.scenario(create_fail="ps-t-worker")
    job = cluster.launch("-n", "1", "python", "t.py")
    assert job.wait(30) == 1, job.output
    assert any("could not submit the job" in ln and "forbidden" in ln for ln in job.lines), job.output
    assert cluster.verbs()[-1] == "delete"          # the root, and with it what was created
