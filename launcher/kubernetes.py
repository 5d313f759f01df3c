"""--launcher kubernetes, the pure half: a ps job as Kubernetes objects.

Core API objects only (no CRD, no operator: any cluster runs them):

* Secret ``<n>-ps``: the job's signing key (and the CURVE secret), mounted read-only. Never an
  env value or a command line, which ``kubectl get -o yaml`` and ``ps`` would show;
* Service ``<n>-scheduler`` (ClusterIP): the scheduler's address. Its name resolves as soon as
  it exists and keeps its IP when the scheduler's pod is replaced, where a pod's own DNS
  record comes late, goes, or is cached stale;
* Service ``<n>`` (headless): every pod's ``subdomain``, so ``<n>-worker-1.<n>`` names a pod;
* one Indexed Job per role, ``<n>-scheduler`` (the root), ``<n>-server``, ``<n>-worker``: a
  pod's completion index is its rank, and a replacement pod keeps it, so it rejoins as the
  same node, as a restarted process does under the local launcher.

Every object but the root names the root in an ownerReference: deleting the root Job deletes
the job. Nothing here runs kubectl (kubejob.py does); the objects are a function of the
arguments, so tests compare them.
"""
from __future__ import annotations

import base64
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ps import exitcodes
from ps.config import VARIABLES, value_of
from ps.errors import ConfigError

from .secret import new_key
from .spec import (
    KubeOptions,
    LaunchSpec,
    Pairs,
    SpecError,
    default_server_command,
    local_argv,
)

KEY_DIR = "/var/run/ps"                  # where the Secret is mounted in every pod
DEFAULT_PORT = 9091                      # the scheduler's port, as MXNet's operator had it
MAX_NAME = 40                            # <n>-scheduler-0, <n>-worker-<index> stay within 63
TTL = 86400                              # a finished Job (and with the root, the job) is kept a day
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"     # the pod's index: its rank
INDEX = f"metadata.annotations['{INDEX_ANNOTATION}']"
JOB_LABEL, ROLE_LABEL = "ps-job", "ps-role"
# set per pod by the manifests; --env may not set them (the key files are the Secret's)
POD_OWNED = frozenset({"DMLC_NODE_HOST", "PS_JOB_KEY_FILE", "PS_SECRET_FILE"})
KUBE_ONLY = ("image", "server_image", "worker_image", "namespace", "job_name", "detach", "kube_version",
             "server_resources", "worker_resources", "scheduler_resources")

_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")       # DNS-1035: it names Services too
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # DNS-1123
_RESOURCE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?\Z")
_VERSION = re.compile(r"v?(\d+)\.(\d+)(\.\d+)?\Z")


# --- options -------------------------------------------------------------------------

def options(args: Any, command: Sequence[str], environ: Mapping[str, str]) -> KubeOptions:
    """The kubernetes options of a parsed command line, checked; SpecError names a bad one."""
    image = args.image
    images = {"scheduler": args.server_image or image, "server": args.server_image or image,
              "worker": args.worker_image or image}
    if not all(images.values()):
        raise SpecError("--launcher kubernetes needs --image IMAGE, the container image every pod runs "
                        "(e.g. --image python:3.11 with ps installed), or both --server-image and --worker-image")
    for option, value in (("--image", image), ("--server-image", args.server_image),
                          ("--worker-image", args.worker_image)):
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise SpecError(f"{option} must be an image reference without spaces, got {value!r}")
    if args.namespace is not None and (len(args.namespace) > 63 or not _NAMESPACE.match(args.namespace)):
        raise SpecError(f"--namespace must be a DNS-1123 label (lowercase letters, digits, '-'), got {args.namespace!r}")
    if args.kube_version is not None and not args.dry_run:
        raise SpecError(f"--kube-version {args.kube_version} is for --dry-run: a submission asks the cluster "
                        "(kubectl version)")
    return KubeOptions(
        name=job_name(args.job_name, command),
        scheduler_image=images["scheduler"], server_image=images["server"], worker_image=images["worker"],
        scheduler_resources=parse_resources("--scheduler-resources", args.scheduler_resources),
        server_resources=parse_resources("--server-resources", args.server_resources),
        worker_resources=parse_resources("--worker-resources", args.worker_resources),
        namespace=args.namespace, port=root_port(environ),
        kube_version=None if args.kube_version is None else parse_version(args.kube_version),
        detach=args.detach)


def job_name(given: str | None, command: Sequence[str]) -> str:
    """--job-name as given (checked), else ``ps-<script>-<5 random>``: a second run of the same
    script must not collide with the first's objects, which may still exist."""
    if given is not None:
        if len(given) > MAX_NAME:
            raise SpecError(f"--job-name {given!r} is {len(given)} characters; at most {MAX_NAME}, so that pod "
                            f"host names (<name>-scheduler-0, <name>-worker-<index>) stay within Kubernetes' 63")
        if not _LABEL.match(given):
            raise SpecError(f"--job-name {given!r}: use lowercase letters, digits and '-', starting with a letter "
                            "and ending with a letter or digit (it names the job's Services: a DNS-1035 label)")
        return given
    words = list(command)
    script = next((w for w in words if w.endswith(".py")), None)
    if script is None and "-m" in words[:-1]:
        script = words[words.index("-m") + 1]
    stem = os.path.basename(script or (words[0] if words else "job")).removesuffix(".py")
    stem = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-") or "job"
    suffix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(5))
    return f"ps-{stem[:MAX_NAME - 9].rstrip('-')}-{suffix}"


def parse_resources(option: str, text: str | None) -> Pairs:
    """``cpu=2,memory=4Gi,nvidia.com/gpu=1`` -> pairs; the pods request and are limited to them."""
    if text is None:
        return ()
    pairs: dict[str, str] = {}
    for item in text.split(","):
        name, eq, quantity = item.strip().partition("=")
        if not eq or not _RESOURCE.match(name) or len(name) > 253:
            raise SpecError(f"{option} expects NAME=QUANTITY[,NAME=QUANTITY...] (e.g. cpu=2,memory=4Gi,"
                            f"nvidia.com/gpu=1), got {item.strip()!r} in {text!r}")
        if not _QUANTITY.match(quantity):
            raise SpecError(f"{option} {name}={quantity!r}: not a Kubernetes quantity (e.g. 2, 500m, 4Gi, 4G)")
        if name in pairs:
            raise SpecError(f"{option} names {name} twice in {text!r}")
        pairs[name] = quantity
    return tuple(pairs.items())


def parse_version(text: str, option: str = "--kube-version") -> tuple[int, int]:
    m = _VERSION.match(text.strip())
    if not m:
        raise SpecError(f"{option} must look like 1.29 (MAJOR.MINOR), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def root_port(environ: Mapping[str, str]) -> int:
    """DMLC_PS_ROOT_PORT from the launcher's environment, else 9091 (0 means any: not here)."""
    try:
        port = value_of("DMLC_PS_ROOT_PORT", environ)
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    return port or DEFAULT_PORT


def check_env(spec: LaunchSpec) -> None:
    """The --env values the pods get: not the names the pods' own settings own, and a ps
    variable must parse (a bad one would fail every pod, after the submission)."""
    known = {v.name for v in VARIABLES}
    for option, pairs in (("--env", spec.env), ("--env-server", spec.env_server), ("--env-worker", spec.env_worker)):
        for name, value in pairs:
            if name in POD_OWNED:
                raise SpecError(f"{option} {name}: with --launcher kubernetes the manifests set {name} "
                                f"(the pod's IP, or a file of the job's Secret under {KEY_DIR}/)")
            if name in known:
                try:
                    value_of(name, {name: value})
                except ConfigError as exc:
                    raise SpecError(f"{option} {name}: {exc}") from None


# --- the job ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Features:
    """What the cluster's Job API does, by its version (beta features are on by default)."""

    version: tuple[int, int] | None = None     # None: the newest

    def _since(self, major: int, minor: int) -> bool:
        return self.version is None or self.version >= (major, minor)

    @property
    def per_index(self) -> bool:
        """backoffLimitPerIndex and maxFailedIndexes: beta from 1.29."""
        return self._since(1, 29)

    @property
    def failure_policy(self) -> bool:
        """podFailurePolicy: beta from 1.26."""
        return self._since(1, 26)

    @property
    def replacement_policy(self) -> bool:
        """podReplacementPolicy: beta from 1.29."""
        return self._since(1, 29)

    @property
    def conditions_listed(self) -> bool:
        """Before 1.29 the API schema lists onPodConditions in every podFailurePolicy rule
        (an empty list beside onExitCodes is accepted: the server checks its length)."""
        return not self._since(1, 29)

    def fallback(self, restarts: int) -> str | None:
        """One line saying what an older cluster gets instead of per-pod restarts, or None."""
        if not restarts or self.per_index:
            return None
        v = ".".join(map(str, self.version or ()))
        line = (f"Kubernetes {v} has no per-pod restart limit (backoffLimitPerIndex, 1.29): each role's pods "
                f"share --max-restarts {restarts} x their count (backoffLimit), so one pod may use all of them")
        if self.failure_policy:
            return line + "; a replacement may start before the failed pod is gone (podReplacementPolicy, 1.29)"
        return line + ("; evictions count as failures and a configuration error is retried "
                       "(podFailurePolicy, 1.26)")


@dataclass(frozen=True)
class Role:
    """One role's Indexed Job: how many pods, what each runs."""

    name: str                       # scheduler, server, worker: also the container's name
    count: int
    image: str
    command: tuple[str, ...]
    env: Pairs                      # literal values; the per-pod ones are added by the manifest
    resources: Pairs
    dmlc_role: str = ""             # DMLC_ROLE, when not the name (a worker is joint with --mode mpi)


@dataclass(frozen=True)
class KubeJob:
    """Everything the manifests say, resolved: the namespace, the cluster's features, the keys."""

    name: str
    namespace: str
    port: int
    roles: tuple[Role, ...]         # the scheduler first: the root
    max_restarts: int
    features: Features
    files: tuple[tuple[str, bytes], ...] = ()   # the Secret's files: job.key, curve.secret

    @property
    def root(self) -> str:
        return f"{self.name}-scheduler"

    @property
    def scheduler_host(self) -> str:
        return f"{self.name}-scheduler.{self.namespace}.svc"


def secret_files(spec: LaunchSpec, environ: Mapping[str, str]) -> tuple[tuple[str, bytes], ...]:
    """A fresh job key (unless --no-auth), and the launcher's PS_SECRET_FILE (CURVE) if set."""
    files = [("job.key", new_key().encode())] if spec.auth else []
    path = environ.get("PS_SECRET_FILE")
    if path:
        try:
            with open(path, "rb") as f:
                secret = f.read()
        except OSError as exc:
            raise SpecError(f"PS_SECRET_FILE={path!r} cannot be read: {exc.strerror}") from None
        if len(secret.strip()) < 16:
            raise SpecError(f"PS_SECRET_FILE={path!r} holds {len(secret.strip())} bytes; use at least 16 random "
                            "bytes (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")
        files.append(("curve.secret", secret))
    return tuple(files)


def plan(spec: LaunchSpec, namespace: str, features: Features,
         files: tuple[tuple[str, bytes], ...] = ()) -> KubeJob:
    """The job of ``spec`` in ``namespace`` on a cluster with ``features``."""
    kube = spec.kube
    assert kube is not None, "plan() is for --launcher kubernetes"
    common: dict[str, str] = {"DMLC_NUM_SERVER": str(spec.num_servers), "DMLC_NUM_WORKER": str(spec.num_workers),
                              "DMLC_PS_ROOT_PORT": str(kube.port), "DMLC_USE_KUBERNETES": "1",
                              "DMLC_JOB_CLUSTER": "kubernetes", "PYTHONUNBUFFERED": "1"}
    if spec.max_restarts:
        common["PS_MAX_RESTARTS"] = str(spec.max_restarts)
    names = {name for name, _ in files}
    if "job.key" in names:
        common["PS_JOB_KEY_FILE"] = f"{KEY_DIR}/job.key"
    if "curve.secret" in names:
        common["PS_SECRET_FILE"] = f"{KEY_DIR}/curve.secret"
    ps_command = default_server_command(spec.command, "python")   # the image's python
    roles = []
    for role, count in (("scheduler", 1), *spec.processes()):
        user = dict(spec.env) if role == "scheduler" else spec.user_env(role)
        command = tuple(local_argv(spec.command)) if role == "worker" else ps_command
        roles.append(Role(role, count, kube.image(role), command, tuple({**common, **user}.items()),
                          kube.resources(role), spec.dmlc_role(role)))
    return KubeJob(kube.name, namespace, kube.port, tuple(roles), spec.max_restarts, features, files)


# --- the objects -------------------------------------------------------------------------

def manifests(job: KubeJob, owner_uid: str | None = None) -> list[dict[str, Any]]:
    """Every object of the job, in the order to apply them: the Secret and Services before
    the Jobs whose pods use them. With ``owner_uid`` (the root Job's, known once it exists)
    every object but the root names the root as its owner."""
    objects = [secret(job)] if job.files else []
    objects += [scheduler_service(job), headless_service(job)]
    objects += [indexed_job(job, role) for role in job.roles]
    if owner_uid is not None:
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.root, "uid": owner_uid,
                 "blockOwnerDeletion": True, "controller": False}
        for obj in objects:
            if obj["metadata"]["name"] != job.root or obj["kind"] != "Job":
                obj["metadata"]["ownerReferences"] = [dict(owner)]
    return objects


def _metadata(job: KubeJob, name: str, role: str | None = None) -> dict[str, Any]:
    labels = {JOB_LABEL: job.name, **({ROLE_LABEL: role} if role else {})}
    return {"name": name, "namespace": job.namespace, "labels": labels}


def secret(job: KubeJob) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _metadata(job, f"{job.name}-ps"),
            "type": "Opaque", "immutable": True,
            "data": {name: base64.b64encode(content).decode() for name, content in job.files}}


def scheduler_service(job: KubeJob) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(job, job.root, "scheduler"),
            "spec": {"type": "ClusterIP", "selector": {JOB_LABEL: job.name, ROLE_LABEL: "scheduler"},
                     "ports": [{"name": "ps", "port": job.port, "targetPort": job.port, "protocol": "TCP"}]}}


def headless_service(job: KubeJob) -> dict[str, Any]:
    """Pods get DNS names under it before they are ready (ps has no readiness probe to pass)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(job, job.name),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {JOB_LABEL: job.name}}}


def _env(job: KubeJob, role: Role) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}
    # the scheduler binds DMLC_PS_ROOT_URI's address: its own pod IP, not the Service's, which
    # is no interface of the pod; everyone else connects through the Service
    root = field("status.podIP") if role.name == "scheduler" else {"value": job.scheduler_host}
    env = [{"name": "DMLC_ROLE", "value": role.dmlc_role or role.name}, {"name": "DMLC_PS_ROOT_URI", **root},
           {"name": "DMLC_RANK", **field(INDEX)}, {"name": "DMLC_NODE_HOST", **field("status.podIP")}]
    return env + [{"name": name, "value": value} for name, value in role.env]


def _restarts(job: KubeJob, role: Role) -> dict[str, Any]:
    """--max-restarts N on one role's Job: N per pod (per index), evictions not counted, a
    configuration error (ps.exitcodes.FATAL) fails the job at once; older clusters: below."""
    n, has = job.max_restarts, job.features
    if not n:
        return {"backoffLimit": 0}
    spec: dict[str, Any] = {}
    if has.per_index:
        spec.update(backoffLimitPerIndex=n, maxFailedIndexes=0)
    else:
        spec["backoffLimit"] = n * role.count
    if has.replacement_policy:
        spec["podReplacementPolicy"] = "Failed"     # never two pods of one rank at once
    if has.failure_policy:                          # what no rule matches is counted
        spec["podFailurePolicy"] = {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": role.name, "operator": "In",
                                                  "values": list(exitcodes.FATAL)},
             **({"onPodConditions": []} if has.conditions_listed else {})}]}
    return spec


def indexed_job(job: KubeJob, role: Role) -> dict[str, Any]:
    container: dict[str, Any] = {"name": role.name, "image": role.image, "command": list(role.command),
                                 "env": _env(job, role), "terminationMessagePolicy": "FallbackToLogsOnError"}
    if role.name == "scheduler":
        container["ports"] = [{"name": "ps", "containerPort": job.port, "protocol": "TCP"}]
    if role.resources:
        container["resources"] = {"requests": dict(role.resources), "limits": dict(role.resources)}
    pod: dict[str, Any] = {"subdomain": job.name, "restartPolicy": "Never", "enableServiceLinks": False,
                           "automountServiceAccountToken": False, "containers": [container]}
    if job.files:
        container["volumeMounts"] = [{"name": "ps-secret", "mountPath": KEY_DIR, "readOnly": True}]
        pod["volumes"] = [{"name": "ps-secret", "secret": {"secretName": f"{job.name}-ps", "defaultMode": 0o400}}]
    spec = {"completionMode": "Indexed", "completions": role.count, "parallelism": role.count,
            "ttlSecondsAfterFinished": TTL, **_restarts(job, role),
            "template": {"metadata": {"labels": {JOB_LABEL: job.name, ROLE_LABEL: role.name}}, "spec": pod}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(job, f"{job.name}-{role.name}", role.name),
            "spec": spec}
