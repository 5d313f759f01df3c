"""What to launch: a frozen :class:`LaunchSpec` built once from the command line."""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .hosts import Host

LAUNCHERS = ("local", "ssh", "mpi", "slurm", "sge", "yarn", "kubernetes")

# Set by the launcher for every process; --env may not override them.
RESERVED = frozenset({
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
    "DMLC_TASK_ID", "DMLC_RANK", "DMLC_JOB_CLUSTER",
})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PYTHON = re.compile(r"python[0-9.]*\Z")
_SHELL_CHARS = set(" \t\n;|&<>$`'\"(){}*?~")


class SpecError(ValueError):
    """A launcher option is invalid; the message names it and the bad value."""


Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class KubeOptions:
    """--launcher kubernetes: what the pods run and where, checked by
    ``launcher.kubernetes.options`` (kept here, a plain record, so spec.py imports no backend)."""

    name: str                                # the job's name: every object's name starts with it
    scheduler_image: str
    server_image: str
    worker_image: str
    scheduler_resources: Pairs = ()          # (resource, quantity): requests = limits
    server_resources: Pairs = ()
    worker_resources: Pairs = ()
    namespace: str | None = None             # None: the kubectl context's (a dry run: "default")
    port: int = 9091                         # the scheduler's port (DMLC_PS_ROOT_PORT)
    kube_version: tuple[int, int] | None = None  # --kube-version for a dry run; None: the newest
    detach: bool = False

    def image(self, role: str) -> str:
        return {"scheduler": self.scheduler_image, "server": self.server_image}.get(role, self.worker_image)

    def resources(self, role: str) -> Pairs:
        return {"scheduler": self.scheduler_resources, "server": self.server_resources}.get(
            role, self.worker_resources)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a backend needs, parsed and validated (no environment reads after this)."""

    num_workers: int
    num_servers: int
    command: tuple[str, ...]
    launcher: str = "local"
    hosts: tuple[Host, ...] = ()
    hostfile: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # --env, every role
    env_server: tuple[tuple[str, str], ...] = ()
    env_worker: tuple[tuple[str, str], ...] = ()
    sync_dst_dir: str | None = None
    log_dir: str | None = None
    dry_run: bool = False
    timeout: float | None = None
    verbose: int = 0
    host_ip: str | None = None
    cwd: str = field(default_factory=os.getcwd)
    server_command: tuple[str, ...] = ()
    slurm_server_nodes: int | None = None
    slurm_worker_nodes: int | None = None
    sge_queue: str | None = None
    yarn_queue: str | None = None
    auth: bool = True                        # a per-job signing key (secret.py)
    job_key: str | None = None               # the key file the launcher made for this job (ssh hands it over)
    max_restarts: int = 0                    # --max-restarts: failed servers/workers started again
    dashboard: str | None = None             # --dashboard [HOST:]PORT: the scheduler's PS_DASHBOARD
    kube: KubeOptions | None = None          # --launcher kubernetes only
    mode: str = "ps"                         # --mode: ps (server processes apart) or mpi (joint workers)

    @property
    def joint(self) -> bool:
        """--mode mpi: every worker process holds one server shard (DMLC_ROLE=joint), no servers apart."""
        return self.mode == "mpi"

    @property
    def server_processes(self) -> int:
        """The server processes to start: none with --mode mpi (``num_servers`` still counts the shards)."""
        return 0 if self.joint else self.num_servers

    def processes(self) -> tuple[tuple[str, int], ...]:
        """(role, how many) for each role that has processes to start: servers, then workers."""
        return tuple((role, n) for role, n in (("server", self.server_processes), ("worker", self.num_workers))
                     if n)

    def dmlc_role(self, role: str) -> str:
        """DMLC_ROLE of ``role``'s processes: a worker is joint with --mode mpi."""
        return "joint" if self.joint and role == "worker" else role

    def role_command(self, role: str) -> tuple[str, ...]:
        return self.server_command if role == "server" else self.command

    def user_env(self, role: str) -> dict[str, str]:
        """--env plus --env-server or --env-worker (the latter wins), for ``role``; a joint
        worker (--mode mpi) is a server too: both, --env-worker winning."""
        if self.joint and role == "worker":
            return dict(self.env) | dict(self.env_server) | dict(self.env_worker)
        extra = self.env_server if role == "server" else self.env_worker
        return dict(self.env) | dict(extra)


def parse_env_pair(text: str, environ: Mapping[str, str], option: str = "--env") -> tuple[str, str]:
    """``NAME:VALUE`` (dmlc), also ``NAME=VALUE``; a bare ``NAME`` forwards the launcher's value."""
    for sep in (":", "="):
        name, found, value = text.partition(sep)
        if found and _NAME.match(name):
            break
    else:
        name, value = text, None
        if not _NAME.match(name):
            raise SpecError(f"{option} expects NAME:VALUE (e.g. OMP_NUM_THREADS:4), got {text!r}")
        if name not in environ:
            raise SpecError(f"{option} {name}: no value given and {name} is not set in the launcher's environment")
        value = environ[name]
    if name in RESERVED:
        raise SpecError(f"{option} {name}: the launcher sets {name} itself")
    return name, value


def is_python(argv0: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(argv0)))


def is_shell_string(command: Sequence[str]) -> bool:
    """A single word with spaces or shell syntax is run by ``sh -c``, as dmlc's launchers did."""
    return len(command) == 1 and any(c in _SHELL_CHARS for c in command[0])


def default_server_command(command: Sequence[str], launcher_python: str) -> tuple[str, ...]:
    """Servers run ``<python> -m ps`` with the worker command's interpreter when it is Python."""
    if command and not is_shell_string(command) and is_python(command[0]):
        return (command[0], "-m", "ps")
    return (launcher_python, "-m", "ps")


def shell_join(command: Sequence[str]) -> str:
    """The command as one POSIX shell string (a dmlc-style shell string is kept as is)."""
    if is_shell_string(command):
        return command[0]
    return " ".join(shlex.quote(a) for a in command)


def local_argv(command: Sequence[str]) -> list[str]:
    """argv for a local exec: shell strings go through ``sh -c``."""
    if is_shell_string(command):
        return ["/bin/sh", "-c", command[0]]
    return list(command)
