"""A kubelet and Job controller on one machine, for tests: runs the pods of the manifests
``python -m ps.launch --launcher kubernetes --dry-run`` prints as local processes, with the
environment a kubelet would give them, and the Job semantics ps relies on.

- Each pod gets its own loopback address (``status.podIP`` = 127.0.0.N) and hostname; each
  Service a fixed loopback address (a ClusterIP: stable across its pods' replacements; the
  scheduler binds every interface, DMLC_USE_KUBERNETES=1, so connections to it arrive).
- Names resolve through a hosts file bind-mounted over /etc/hosts in the pod's own mount
  namespace (``unshare -m``); ``publish_late`` leaves a Service's name out for a while.
- A Secret volume is its files, mode ``defaultMode``, bind-mounted at its mountPath.
- fieldRefs are resolved (the completion-index annotation, ``status.podIP``,
  ``metadata.name``) and ``JOB_COMPLETION_INDEX`` appended, as the Job controller does.
- Per-index restarts: ``restartPolicy: Never`` with ``backoffLimitPerIndex``; a failed pod
  is replaced (same index, new address) until its index has failed more often than that,
  then the Job fails (FailedIndexes); ``podFailurePolicy``: ``FailJob`` on the listed exit
  codes, ``Ignore`` on ``DisruptionTarget`` (:meth:`Cluster.evict`).

Nothing here is ps: it reads the manifests as Kubernetes would.
"""
from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import ROOT

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


@dataclass
class Pod:
    job: str
    index: int
    ip: str
    proc: subprocess.Popen
    log: Path
    disrupted: bool = False


@dataclass
class JobState:
    spec: dict
    failures: dict[int, int] = field(default_factory=dict)
    succeeded: set[int] = field(default_factory=set)
    condition: str | None = None        # "Complete" or "Failed"
    reason: str | None = None


class Cluster:
    def __init__(self, objects: list[dict], workdir: Path, backoff: float = 0.5,
                 publish_late: dict[str, float] | None = None):
        self.workdir = workdir
        self.backoff = backoff
        self.objects = objects
        self.jobs = {o["metadata"]["name"]: JobState(o) for o in objects if o["kind"] == "Job"}
        self.secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        self.services = [o for o in objects if o["kind"] == "Service"]
        self.namespace = objects[0]["metadata"].get("namespace", "default")
        self.pods: dict[tuple[str, int], Pod] = {}
        self.history: list[Pod] = []
        self._next_ip = 2
        self._service_ip = {s["metadata"]["name"]: f"127.0.1.{i + 1}" for i, s in enumerate(self.services)}
        self._late = {name: time.monotonic() + delay for name, delay in (publish_late or {}).items()}
        self.hosts = workdir / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n")
        self._hosts_text = ""
        self._pending: list[tuple[float, str, int]] = []

    # -- names ---------------------------------------------------------------------------
    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"]
        now = time.monotonic()
        for svc in self.services:
            name = svc["metadata"]["name"]
            if self._late.get(name, 0) > now:
                continue
            ns = self.namespace
            lines.append(f"{self._service_ip[name]} {name}.{ns}.svc {name}.{ns}.svc.cluster.local {name}")
        for pod in self.pods.values():
            template = self.jobs[pod.job].spec["spec"]["template"]["spec"]
            sub = template.get("subdomain")
            host = f"{pod.job}-{pod.index}"
            names = [host] + ([f"{host}.{sub}", f"{host}.{sub}.{self.namespace}.svc"] if sub else [])
            lines.append(f"{pod.ip} {' '.join(names)}")
        text = "\n".join(lines) + "\n"
        if text == self._hosts_text:
            return
        self._hosts_text = text
        with open(self.hosts, "r+") as fh:      # in place: the bind mounts see the same file
            fh.seek(0)
            fh.write(text)
            fh.truncate()

    # -- pods ----------------------------------------------------------------------------
    def start(self) -> None:
        for name, job in self.jobs.items():
            for index in range(job.spec["spec"]["completions"]):
                self._start_pod(name, index)
        self._write_hosts()

    def _start_pod(self, job: str, index: int) -> None:
        spec = self.jobs[job].spec["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        name = f"{job}-{index}-{self._next_ip}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
        env["PYTHONPATH"] = str(ROOT)
        for var in container.get("env", []):
            env[var["name"]] = self._value(var, index, ip, name)
        env["JOB_COMPLETION_INDEX"] = str(index)
        env["HOSTNAME"] = f"{job}-{index}"
        mounts = [f"mount --bind {self.hosts} /etc/hosts"]
        for vm in container.get("volumeMounts", []):
            source = self._volume(spec, vm["name"], name)
            mounts.append(f"mkdir -p {vm['mountPath']} && mount --bind {source} {vm['mountPath']}")
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        log = self.workdir / f"{name}.log"
        script = " && ".join(mounts) + ' && exec "$@"'
        proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script, "pod", *argv], env=env, cwd=str(ROOT),
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        pod = Pod(job, index, ip, proc, log)
        self.pods[(job, index)] = pod
        self.history.append(pod)

    def _value(self, var: dict, index: int, ip: str, pod_name: str) -> str:
        if "value" in var:
            return var["value"]
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        if path == f"metadata.annotations['{INDEX_ANNOTATION}']":
            return str(index)
        if path == "status.podIP":
            return ip
        if path == "metadata.name":
            return pod_name
        raise ValueError(f"the emulated kubelet does not resolve fieldRef {path!r}")

    def _volume(self, spec: dict, name: str, pod_name: str) -> Path:
        (volume,) = [v for v in spec["volumes"] if v["name"] == name]
        secret = self.secrets[volume["secret"]["secretName"]]
        target = self.workdir / "volumes" / pod_name / name
        target.mkdir(parents=True)
        for key, value in secret.get("data", {}).items():
            path = target / key
            path.write_bytes(base64.b64decode(value))
            path.chmod(volume["secret"].get("defaultMode", 0o644))
        return target

    # -- the Job controller ----------------------------------------------------------------
    def kill(self, job: str, index: int, sig: int = signal.SIGKILL) -> None:
        self.pods[(job, index)].proc.send_signal(sig)

    def evict(self, job: str, index: int) -> None:
        """SIGTERM with the DisruptionTarget condition: an eviction or preemption."""
        pod = self.pods[(job, index)]
        pod.disrupted = True
        pod.proc.send_signal(signal.SIGTERM)

    def step(self) -> None:
        now = time.monotonic()
        for when, job, index in [p for p in self._pending if p[0] <= now]:
            self._pending.remove((when, job, index))
            if self.jobs[job].condition is None:
                self._start_pod(job, index)
                self._write_hosts()
        if self._late and min(self._late.values()) <= now:
            self._late = {k: v for k, v in self._late.items() if v > now}
            self._write_hosts()
        for key, pod in list(self.pods.items()):
            code = pod.proc.poll()
            if code is None:
                continue
            del self.pods[key]
            self._ended(pod, code)
        self._write_hosts()

    def _ended(self, pod: Pod, code: int) -> None:
        state = self.jobs[pod.job]
        spec = state.spec["spec"]
        if state.condition is not None:
            return
        if code == 0:
            state.succeeded.add(pod.index)
            if len(state.succeeded) == spec["completions"]:
                state.condition, state.reason = "Complete", None
            return
        exit_code = code if code > 0 else 128 - code
        for rule in spec.get("podFailurePolicy", {}).get("rules", []):
            on_codes = rule.get("onExitCodes")
            if on_codes and on_codes["operator"] == "In" and exit_code in on_codes["values"]:
                if rule["action"] == "FailJob":
                    self._fail(pod.job, "PodFailurePolicy")
                    return
            conditions = rule.get("onPodConditions") or []
            if pod.disrupted and any(c["type"] == "DisruptionTarget" for c in conditions) and rule["action"] == "Ignore":
                self._pending.append((time.monotonic() + self.backoff, pod.job, pod.index))
                return
        state.failures[pod.index] = state.failures.get(pod.index, 0) + 1
        limit = spec.get("backoffLimitPerIndex")
        if limit is None:
            limit = spec.get("backoffLimit", 6)
            total = sum(state.failures.values())
            if total > limit:
                self._fail(pod.job, "BackoffLimitExceeded")
                return
        elif state.failures[pod.index] > limit:
            self._fail(pod.job, "FailedIndexes")
            return
        self._pending.append((time.monotonic() + self.backoff, pod.job, pod.index))

    def _fail(self, job: str, reason: str) -> None:
        state = self.jobs[job]
        state.condition, state.reason = "Failed", reason
        for (name, _), pod in list(self.pods.items()):
            if name == job:
                pod.proc.send_signal(signal.SIGTERM)

    def run(self, timeout: float) -> dict[str, tuple[str | None, str | None]]:
        """Step until every Job has a condition (or one failed); (condition, reason) per Job."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.step()
            if all(j.condition for j in self.jobs.values()) or any(j.condition == "Failed" for j in self.jobs.values()):
                break
            time.sleep(0.1)
        return {name: (j.condition, j.reason) for name, j in self.jobs.items()}

    def logs(self) -> str:
        return "\n".join(f"==== {p.job}-{p.index} ({p.ip})\n{p.log.read_text(errors='replace')}" for p in self.history)

    def stop(self) -> None:
        for pod in self.history:
            if pod.proc.poll() is None:
                try:
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                pod.proc.wait(5)
