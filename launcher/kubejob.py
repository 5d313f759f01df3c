"""--launcher kubernetes, the backend: submit the job and follow it, or print its objects.

A dry run prints the manifests (kubernetes.py) as YAML. Otherwise the backend asks the
cluster's version, which decides the Job fields (``kubernetes.Features``), creates the root Job,
then every other object with the root's uid as their owner, and follows the job until it ends
(kubewatch.py) or, with ``--detach``, prints how to follow and delete it. Every request goes
through kubectl (kubectl.py).
"""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping

from . import kubernetes as k8s
from .kubectl import Kubectl, KubectlError
from .kubewatch import follow
from .output import Output
from .process import StopSignal
from .spec import LaunchSpec, SpecError
from .yamlout import dump_all

logger = logging.getLogger(__name__)


class Interrupted(Exception):
    """A second SIGINT/SIGTERM while the first one's deletion runs: exit at once."""


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str], dry_run: bool = False) -> list:
    return []     # the cluster starts every process: the launcher starts none


def host_count(spec: LaunchSpec) -> int | None:
    return None   # the cluster places the pods


def manifests_text(job: k8s.KubeJob) -> str:
    """--dry-run's output: every object, no ownerReferences (no root uid yet), and how to use it."""
    n, ns = job.name, job.namespace
    header = [f"ps job {n}: " + ", ".join(f"{r.count} {r.name}{'s' if r.count != 1 else ''}" for r in job.roles)
              + f", namespace {ns} (python -m ps.launch --launcher kubernetes --dry-run)",
              f"apply: kubectl apply -f FILE; follow: kubectl logs -f -l ps-job={n} -n {ns} --prefix",
              f"delete: kubectl delete job,service,secret -l ps-job={n} -n {ns}",
              "ownerReferences are omitted: they need the uid the root Job gets when it is created, so here",
              f"deleting job/{job.root} does not delete the rest (python -m ps.launch without --dry-run adds them)"]
    if job.files:
        header.append(f"secret/{n}-ps holds the job's keys: keep this output private")
    return dump_all(k8s.manifests(job), header)


def run(spec: LaunchSpec, environ: Mapping[str, str], output: Output, stop: StopSignal | None) -> int:
    kube = spec.kube
    assert kube is not None
    try:
        files = k8s.secret_files(spec, environ)
        if spec.dry_run:
            features = k8s.Features(kube.kube_version)
            _warn_fallback(features, spec.max_restarts)
            output.raw(manifests_text(k8s.plan(spec, kube.namespace or "default", features, files)).rstrip("\n"))
            return 0
        kc = Kubectl(environ)
        features = k8s.Features(kc.server_version())
        kc.namespace = kube.namespace or kc.context_namespace()
    except (SpecError, KubectlError) as exc:
        logger.error("%s", exc)
        return 1
    _warn_fallback(features, spec.max_restarts)
    job = k8s.plan(spec, kc.namespace, features, files)
    stop = stop or StopSignal()
    with SecondSignalExits(stop):
        try:
            submit(kc, job)
        except KubectlError as exc:
            logger.error("could not submit the job: %s", exc)
            return 1
        except Interrupted:
            return stop.code
        if kube.detach and not stop.is_set():      # a signal during the submission: delete it below
            for line in detach_lines(kc, job):
                output.raw(line)
            return 0
        try:
            return follow(kc, job, output, stop, spec.timeout)
        except Interrupted:
            logger.warning("second signal: exiting now; the job may still be deleting (`%s`)",
                           kc.shown("get", "jobs,pods", "-l", f"ps-job={job.name}"))
            return stop.code


def _warn_fallback(features: k8s.Features, restarts: int) -> None:
    line = features.fallback(restarts)
    if line:
        logger.warning("%s", line)


def submit(kc: Kubectl, job: k8s.KubeJob) -> str:
    """Create the root Job, then the rest owned by it; returns the root's uid. If a later
    create fails, deleting the root deletes what was created."""
    objects = k8s.manifests(job)
    root = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == job.root)
    uid = (kc.create(root).get("metadata") or {}).get("uid")
    if not uid:
        raise KubectlError(f"`kubectl create` of job/{job.root} returned no uid")
    try:
        for obj in k8s.manifests(job, uid):
            if obj["kind"] != "Job" or obj["metadata"]["name"] != job.root:
                kc.create(obj)
    except KubectlError:
        try:
            kc.delete_job(job.root)
        except KubectlError as exc:
            logger.error("could not delete the partly created job: %s", exc)
        raise
    roles = ", ".join(f"{r.count} {r.name}{'s' if r.count != 1 else ''}" for r in job.roles)
    logger.info("submitted job %s to namespace %s: %s", job.name, job.namespace, roles)
    return uid


def detach_lines(kc: Kubectl, job: k8s.KubeJob) -> list[str]:
    pods = sum(r.count for r in job.roles)
    label = f"ps-job={job.name}"
    return [f"follow: {kc.shown('logs', '-f', '-l', label, '--prefix', f'--max-log-requests={pods}')}",
            f"status: {kc.shown('get', 'jobs,pods', '-l', label)}",
            f"delete: {kc.shown('delete', 'job', job.root, '--cascade=foreground')}"]


class SecondSignalExits:
    """While the job runs: the first SIGINT/SIGTERM/SIGHUP sets ``stop`` (the job is then
    deleted); a second raises Interrupted wherever the main thread is, even in a kubectl call."""

    def __init__(self, stop: StopSignal):
        self.stop = stop
        self.old: dict[int, Callable | int | None] = {}

    def _handler(self, signum: int, frame: object) -> None:
        if self.stop.is_set():
            raise Interrupted(signum)
        self.stop.set(signum)

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self.old.items():
            signal.signal(sig, previous)
