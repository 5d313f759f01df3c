"""--launcher kubernetes, the pure half: the objects it makes, checked by their invariants
(names, the Service the pods name, restart fields per cluster version, owners, no key
material outside the Secret, each role's env) and its errors on bad input."""
from __future__ import annotations

import base64
import re
from dataclasses import replace

import pytest

from launcher import kubernetes as k8s
from launcher.kubewatch import Pod, condition
from launcher.launch import parse_args
from launcher.spec import SpecError
from ps import exitcodes

PY = "/opt/py/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "OMP_NUM_THREADS": "4"}
BASE = ["--launcher", "kubernetes", "--image", "python:3.11"]
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")          # DNS-1123 label
SERVICE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")           # DNS-1035 label
VERSIONS = [None, (1, 33), (1, 29), (1, 28), (1, 27), (1, 25)]


def spec_of(*argv: str, environ=ENV):
    return parse_args(list(argv), environ, python=PY)


def job_of(*argv: str, version=None, curve: bytes | None = None, environ=ENV, tmp_path=None):
    spec = spec_of(*BASE, *argv, environ=environ)
    files = (("job.key", b"k" * 43),) if spec.auth else ()
    files += (("curve.secret", curve),) if curve else ()
    return k8s.plan(spec, "team-a", k8s.Features(version), files)


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(job_obj):
    return job_obj["spec"]["template"]["spec"]


def env_of(job_obj):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod_spec(job_obj)["containers"][0]["env"]}


def strings(value, skip=None):
    """Every string in ``value`` (keys too), but not inside ``skip``."""
    if value is skip:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v, skip)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v, skip)


# --- invariants over restarts x versions x CURVE ------------------------------------------

@pytest.mark.parametrize("restarts", [0, 2])
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("curve", [None, b"c" * 32])
def test_invariants(restarts, version, curve):
    job = job_of("-n", "3", "-s", "2", "--max-restarts", str(restarts), "--job-name", "ps-a", "python", "t.py",
                 version=version, curve=curve)
    objects = k8s.manifests(job, "uid-1")
    jobs, services = by_kind(objects, "Job"), by_kind(objects, "Service")
    assert set(jobs) == {"ps-a-scheduler", "ps-a-server", "ps-a-worker"}
    assert set(services) == {"ps-a-scheduler", "ps-a"}
    # names: labels within 63, and every pod's host name <job>-<index> too
    for obj in objects:
        name = obj["metadata"]["name"]
        assert (SERVICE if obj["kind"] == "Service" else LABEL).match(name) and len(name) <= 63, name
        assert obj["metadata"]["namespace"] == "team-a" and obj["metadata"]["labels"]["ps-job"] == "ps-a"
    for name, obj in jobs.items():
        spec = obj["spec"]
        assert len(f"{name}-{spec['completions'] - 1}") <= 63
        assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
        assert spec["ttlSecondsAfterFinished"] == k8s.TTL
        pod = pod_spec(obj)
        assert pod["subdomain"] == "ps-a" and pod["restartPolicy"] == "Never"
        assert pod["enableServiceLinks"] is False and pod["automountServiceAccountToken"] is False
        assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert spec["template"]["metadata"]["labels"] == {"ps-job": "ps-a", "ps-role": name.rsplit("-", 1)[1]}
        # restarts: per index <=> the cluster has it; policies only with restarts
        features = k8s.Features(version)
        if "backoffLimitPerIndex" in spec:
            assert restarts and features.per_index and pod["restartPolicy"] == "Never"
            assert spec["backoffLimitPerIndex"] == restarts and spec["maxFailedIndexes"] == 0
            assert "backoffLimit" not in spec
        else:
            assert not restarts or not features.per_index
            assert spec["backoffLimit"] == restarts * spec["completions"]
        if "podFailurePolicy" in spec:
            assert restarts and features.failure_policy and pod["restartPolicy"] == "Never"
            assert spec.get("podReplacementPolicy") == ("Failed" if features.replacement_policy else None)
            ignore, fail = spec["podFailurePolicy"]["rules"]
            assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
            assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == list(exitcodes.FATAL)
            assert fail["onExitCodes"]["containerName"] == pod["containers"][0]["name"]
        else:
            assert not restarts or not features.failure_policy
            assert "podReplacementPolicy" not in spec
    # the headless Service every pod names, and the scheduler's
    headless = services["ps-a"]["spec"]
    assert headless == {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"ps-job": "ps-a"}}
    sched = services["ps-a-scheduler"]["spec"]
    assert sched["type"] == "ClusterIP" and sched["selector"] == {"ps-job": "ps-a", "ps-role": "scheduler"}
    assert sched["ports"][0]["port"] == sched["ports"][0]["targetPort"] == 9091
    # owners: everything but the root Job names the root, by its uid
    for obj in objects:
        if obj["kind"] == "Job" and obj["metadata"]["name"] == "ps-a-scheduler":
            assert "ownerReferences" not in obj["metadata"]
        else:
            assert obj["metadata"]["ownerReferences"] == [{
                "apiVersion": "batch/v1", "kind": "Job", "name": "ps-a-scheduler", "uid": "uid-1",
                "blockOwnerDeletion": True, "controller": False}]
    assert not any("ownerReferences" in o["metadata"] for o in k8s.manifests(job))


@pytest.mark.parametrize("curve", [None, b"curve-secret-of-32-bytes-exactly"])
def test_no_key_material_outside_the_secret_data(curve):
    spec = spec_of(*BASE, "-n", "2", "--job-name", "ps-a", "python", "t.py")
    files = (("job.key", b"the-job-key-xyz"),) + ((("curve.secret", curve),) if curve else ())
    objects = k8s.manifests(k8s.plan(spec, "default", k8s.Features(), files), "uid-1")
    secret = by_kind(objects, "Secret")["ps-a-ps"]
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == dict(files)
    secrets = [content.decode() for _, content in files]
    secrets += [base64.b64encode(content).decode() for _, content in files]
    for obj in objects:
        for text in strings(obj, skip=secret["data"]):
            assert not any(s in text for s in secrets), (obj["kind"], obj["metadata"]["name"], text)


def test_secret_volume_read_only_0400_and_the_files_named_by_env():
    job = job_of("-n", "1", "--job-name", "ps-a", "python", "t.py", curve=b"c" * 32)
    for obj in by_kind(k8s.manifests(job), "Job").values():
        pod = pod_spec(obj)
        assert pod["volumes"] == [{"name": "ps-secret", "secret": {"secretName": "ps-a-ps", "defaultMode": 0o400}}]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "ps-secret", "mountPath": "/var/run/ps",
                                                        "readOnly": True}]
        env = env_of(obj)
        assert env["PS_JOB_KEY_FILE"] == "/var/run/ps/job.key"
        assert env["PS_SECRET_FILE"] == "/var/run/ps/curve.secret"


def test_no_auth_and_no_curve_makes_no_secret_and_no_volume():
    job = job_of("-n", "1", "--no-auth", "python", "t.py")
    objects = k8s.manifests(job)
    assert not by_kind(objects, "Secret")
    for obj in by_kind(objects, "Job").values():
        assert "volumes" not in pod_spec(obj) and "PS_JOB_KEY_FILE" not in env_of(obj)


def test_the_dmlc_env_of_each_role():
    job = job_of("-n", "3", "-s", "2", "--max-restarts", "1", "--job-name", "ps-a", "--env", "A:1",
                 "--env-server", "S:2", "--env-worker", "W:3", "--env", "PS_VERBOSE:1", "python", "t.py")
    jobs = by_kind(k8s.manifests(job), "Job")
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    for role in ("scheduler", "server", "worker"):
        obj = jobs[f"ps-a-{role}"]
        names = [e["name"] for e in pod_spec(obj)["containers"][0]["env"]]
        assert len(names) == len(set(names)), names
        env = env_of(obj)
        assert env["DMLC_ROLE"] == role
        assert env["DMLC_PS_ROOT_URI"] == (pod_ip if role == "scheduler" else "ps-a-scheduler.team-a.svc")
        assert env["DMLC_RANK"] == index and env["DMLC_NODE_HOST"] == pod_ip
        assert (env["DMLC_PS_ROOT_PORT"], env["DMLC_NUM_SERVER"], env["DMLC_NUM_WORKER"]) == ("9091", "2", "3")
        assert env["DMLC_USE_KUBERNETES"] == "1" and env["PS_MAX_RESTARTS"] == "1"
        assert env["A"] == "1" and env["PS_VERBOSE"] == "1"
        assert ("S" in env, "W" in env) == (role == "server", role == "worker")
        assert "PYTHONPATH" not in env and "DMLC_TASK_ID" not in env
    assert jobs["ps-a-scheduler"]["spec"]["template"]["spec"]["containers"][0]["ports"] == [
        {"name": "ps", "containerPort": 9091, "protocol": "TCP"}]


def test_the_scheduler_port_comes_from_dmlc_ps_root_port():
    job = job_of("-n", "1", "python", "t.py", environ={**ENV, "DMLC_PS_ROOT_PORT": "9200"})
    svc = by_kind(k8s.manifests(job), "Service")[job.root]
    assert svc["spec"]["ports"][0]["port"] == 9200
    assert env_of(by_kind(k8s.manifests(job), "Job")[f"{job.name}-worker"])["DMLC_PS_ROOT_PORT"] == "9200"


@pytest.mark.parametrize("command, ps_command, worker_command", [
    (["python", "train.py", "--lr", "0.1"], ["python", "-m", "ps"], ["python", "train.py", "--lr", "0.1"]),
    (["/opt/venv/bin/python3", "t.py"], ["/opt/venv/bin/python3", "-m", "ps"], ["/opt/venv/bin/python3", "t.py"]),
    (["./run.sh", "x"], ["python", "-m", "ps"], ["./run.sh", "x"]),
    (["cd src && python t.py"], ["python", "-m", "ps"], ["/bin/sh", "-c", "cd src && python t.py"]),
])
def test_commands_python_m_ps_for_the_scheduler_and_servers_the_users_for_workers(command, ps_command,
                                                                                   worker_command):
    jobs = by_kind(k8s.manifests(job_of("-n", "1", "--job-name", "ps-a", *command)), "Job")
    assert pod_spec(jobs["ps-a-scheduler"])["containers"][0]["command"] == ps_command
    assert pod_spec(jobs["ps-a-server"])["containers"][0]["command"] == ps_command
    assert pod_spec(jobs["ps-a-worker"])["containers"][0]["command"] == worker_command


def test_images_and_resources_per_role():
    job = job_of("-n", "1", "--job-name", "ps-a", "--worker-image", "me/train:1", "--server-image", "me/ps:1",
                 "--worker-resources", "cpu=2,memory=4Gi,nvidia.com/gpu=1", "--scheduler-resources", "cpu=500m",
                 "python", "t.py")
    jobs = by_kind(k8s.manifests(job), "Job")
    containers = {name: pod_spec(obj)["containers"][0] for name, obj in jobs.items()}
    assert [containers[f"ps-a-{r}"]["image"] for r in ("scheduler", "server", "worker")] == \
        ["me/ps:1", "me/ps:1", "me/train:1"]
    gpu = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert containers["ps-a-worker"]["resources"] == {"requests": gpu, "limits": gpu}
    assert containers["ps-a-scheduler"]["resources"] == {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    assert "resources" not in containers["ps-a-server"]


def test_older_clusters_get_a_shared_budget_and_one_warning_line():
    old = job_of("-n", "3", "-s", "2", "--max-restarts", "2", "python", "t.py", version=(1, 27))
    jobs = by_kind(k8s.manifests(old), "Job")
    assert [jobs[f"{old.name}-{r}"]["spec"]["backoffLimit"] for r in ("scheduler", "server", "worker")] == [2, 4, 6]
    assert all("podFailurePolicy" in j["spec"] and "podReplacementPolicy" not in j["spec"] for j in jobs.values())
    warning = k8s.Features((1, 27)).fallback(2)
    assert "Kubernetes 1.27" in warning and "backoffLimit" in warning and "\n" not in warning
    ancient = by_kind(k8s.manifests(job_of("-n", "1", "--max-restarts", "2", "python", "t.py", version=(1, 25))),
                      "Job")
    assert not any("podFailurePolicy" in j["spec"] for j in ancient.values())
    assert "podFailurePolicy, 1.26" in k8s.Features((1, 25)).fallback(2)
    assert k8s.Features((1, 27)).fallback(0) is None and k8s.Features((1, 29)).fallback(2) is None
    assert k8s.Features().fallback(2) is None


def test_the_default_job_name_is_the_script_a_random_suffix_and_short():
    for command, stem in ((["python", "train.py"], "train"), (["python", "-m", "ps.check"], "ps-check"),
                          (["python", "/x/My_Very_Long_Training_Script_Name_For_Imagenet.py"], None)):
        name = spec_of(*BASE, "-n", "1", *command).kube.name
        assert len(name) <= k8s.MAX_NAME and SERVICE.match(name), name
        assert re.fullmatch(rf"ps-{stem or '[a-z0-9-]+'}-[a-z0-9]{{5}}", name), name
    assert spec_of(*BASE, "-n", "1", "python", "t.py").kube.name != spec_of(*BASE, "-n", "1", "python", "t.py").kube.name


@pytest.mark.parametrize("argv, message", [
    (["--launcher", "kubernetes", "-n", "1", "python", "t.py"], "--launcher kubernetes needs --image IMAGE"),
    ([*BASE, "-n", "0", "python", "t.py"], "-n/--num-workers must be >= 1, got 0"),
    ([*BASE, "-n", "1", "--worker-resources", "memory=4GB", "x"], "--worker-resources memory='4GB': not a Kubernetes quantity"),
    ([*BASE, "-n", "1", "--server-resources", "cpu", "x"], "--server-resources expects NAME=QUANTITY.*got 'cpu'"),
    ([*BASE, "-n", "1", "--worker-resources", "cpu=1,cpu=2", "x"], "--worker-resources names cpu twice"),
    ([*BASE, "-n", "1", "--job-name", "a" * 41, "x"], f"--job-name '{'a' * 41}' is 41 characters; at most 40"),
    ([*BASE, "-n", "1", "--job-name", "My_Job", "x"], "--job-name 'My_Job': use lowercase letters"),
    ([*BASE, "-n", "1", "--job-name", "9lives", "x"], "--job-name '9lives': use lowercase letters"),
    ([*BASE, "-n", "1", "--namespace", "Team A", "x"], "--namespace must be a DNS-1123 label.*'Team A'"),
    ([*BASE, "-n", "1", "--kube-version", "1.27", "x"], "--kube-version 1.27 is for --dry-run"),
    ([*BASE, "-n", "1", "--dry-run", "--kube-version", "1.x", "x"], "--kube-version must look like 1.29.*'1.x'"),
    ([*BASE, "-n", "1", "--image", "a b", "x"], "--image must be an image reference without spaces, got 'a b'"),
    (["-n", "1", "--image", "python:3.11", "x"], "--image: for --launcher kubernetes only \\(not local\\)"),
    (["-n", "1", "--launcher", "slurm", "--detach", "x"], "--detach: for --launcher kubernetes only"),
    ([*BASE, "-n", "1", "-H", "/nonexistent", "x"], "nonexistent"),
])
def test_bad_input_is_a_clear_error_naming_the_value(argv, message):
    with pytest.raises((SpecError, OSError), match=message):
        spec_of(*argv)


@pytest.mark.parametrize("env, message", [
    (["--env", "DMLC_NODE_HOST:1.2.3.4"], "--env DMLC_NODE_HOST: with --launcher kubernetes the manifests set"),
    (["--env-worker", "PS_JOB_KEY_FILE:/k"], "--env-worker PS_JOB_KEY_FILE: with --launcher kubernetes"),
    (["--env", "PS_HEARTBEAT_TIMEOUT:soon"], ("--env PS_HEARTBEAT_TIMEOUT: PS_HEARTBEAT_TIMEOUT must be a "
                                              "number, got 'soon'")),
])
def test_env_the_pods_cannot_take_is_a_command_line_error(env, message):
    with pytest.raises(SpecError, match=message):
        spec_of(*BASE, "-n", "1", *env, "x")


def test_secret_files_a_fresh_key_each_job_and_the_curve_secret(tmp_path):
    spec = spec_of(*BASE, "-n", "1", "x")
    first, second = dict(k8s.secret_files(spec, ENV)), dict(k8s.secret_files(spec, ENV))
    assert set(first) == {"job.key"} and len(first["job.key"]) >= 43 and first["job.key"] != second["job.key"]
    assert k8s.secret_files(replace(spec, auth=False), ENV) == ()
    curve = tmp_path / "curve"
    curve.write_bytes(b"0123456789abcdef-secret\n")
    files = dict(k8s.secret_files(spec, {**ENV, "PS_SECRET_FILE": str(curve)}))
    assert files["curve.secret"] == b"0123456789abcdef-secret\n"
    curve.write_bytes(b"short\n")
    with pytest.raises(SpecError, match=f"PS_SECRET_FILE='{curve}' holds 5 bytes; use at least 16"):
        k8s.secret_files(spec, {**ENV, "PS_SECRET_FILE": str(curve)})
    with pytest.raises(SpecError, match="PS_SECRET_FILE='/nonexistent' cannot be read"):
        k8s.secret_files(spec, {**ENV, "PS_SECRET_FILE": "/nonexistent"})


def test_max_restarts_is_allowed_and_reaches_every_pod():
    spec = spec_of(*BASE, "-n", "2", "--max-restarts", "3", "python", "t.py")
    assert spec.max_restarts == 3 and spec.kube.detach is False and spec.kube.namespace is None


# --- what the follower reads of pods and Jobs ------------------------------------------

def test_a_pod_as_the_follower_reads_it():
    obj = {"metadata": {"name": "ps-a-worker-1-x7", "uid": "u7", "labels": {"ps-role": "worker"},
                        "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
           "status": {"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True"}],
                      "containerStatuses": [{"state": {"terminated": {
                          "exitCode": 137, "reason": "Error", "message": "bye", "finishedAt": "2026-01-01T00:00:09Z"}}}]}}
    pod = Pod.of(obj)
    assert (pod.uid, pod.label, pod.phase, pod.exit_code, pod.message) == ("u7", "worker 1", "Failed", 137, "bye")
    assert pod.ending() == "exit 137 (Error) after an eviction or preemption: not counted"
    pending = Pod.of({"metadata": {"name": "p", "uid": "u8"}, "status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}})
    assert pending.waiting == 'waiting: ImagePullBackOff: Back-off pulling image "nope"'
    creating = Pod.of({"metadata": {"name": "p"}, "status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]}})
    assert creating.waiting == "" and creating.uid == "p"


def test_job_conditions():
    job = {"status": {"conditions": [{"type": "FailureTarget", "status": "True"},
                                     {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}}
    assert condition(job, "Failed")["reason"] == "PodFailurePolicy"
    assert condition(job, "Complete") is None and condition(None, "Failed") is None
    assert condition({"status": {"conditions": [{"type": "Complete", "status": "False"}]}}, "Complete") is None


def test_dashboard_reaches_the_scheduler_pod():
    """--dashboard on Kubernetes: the scheduler's pod gets PS_DASHBOARD (reached with kubectl
    port-forward); a bad address is refused before anything is made."""
    jobs = by_kind(k8s.manifests(job_of("-n", "1", "--dashboard", "8787", "--job-name", "ps-a", "python", "t.py")), "Job")
    assert env_of(jobs["ps-a-scheduler"])["PS_DASHBOARD"] == "8787"
    with pytest.raises(SpecError, match=r"--dashboard: PS_DASHBOARD must be \[HOST:\]PORT.*'x:y'"):
        spec_of(*BASE, "-n", "1", "--dashboard", "x:y", "python", "t.py")


def test_mode_mpi_makes_no_server_job_and_joint_worker_pods():
    """--mode mpi: the scheduler's and the workers' Jobs only; each worker pod is joint and
    counts as one of the job's n servers."""
    objects = k8s.manifests(job_of("-n", "3", "--mode", "mpi", "python", "train.py"))
    jobs = by_kind(objects, "Job")
    roles = sorted(j["metadata"]["labels"][k8s.ROLE_LABEL] for j in jobs.values())
    assert roles == ["scheduler", "worker"]
    worker = next(j for j in jobs.values() if j["metadata"]["labels"][k8s.ROLE_LABEL] == "worker")
    env = env_of(worker)
    assert (env["DMLC_ROLE"], env["DMLC_NUM_SERVER"], env["DMLC_NUM_WORKER"]) == ("joint", "3", "3")
    assert worker["spec"]["completions"] == 3
    scheduler = next(j for j in jobs.values() if j["metadata"]["labels"][k8s.ROLE_LABEL] == "scheduler")
    assert env_of(scheduler)["DMLC_ROLE"] == "scheduler" and env_of(scheduler)["DMLC_NUM_SERVER"] == "3"
