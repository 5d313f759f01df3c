"""The job's rendezvous: the in-process scheduler and the ``DMLC_*`` env of every process.

The names are dmlc-core tracker's (``DMLC_NUM_WORKER``, ``DMLC_PS_ROOT_URI``, ...). Unlike
dmlc's ``PSTracker`` the scheduler binds port 0 itself and reports the port it got, so
there is no probe-then-release race (style R25).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ps import netutil
from ps import horovod
from ps.config import value_of
from ps.mxnet_autoload import MXNET_AUTOLOAD

from .hosts import Task, is_loopback
from .output import EXIT_MARKER
from .spec import RESERVED, LaunchSpec

logger = logging.getLogger(__name__)

# Forwarded from the launcher's environment to remote processes (ssh exports, mpirun -x,
# qsub -v, yarn -shell_env) besides the DMLC_*/PS_* tunables ps reads. Never secrets:
# PS_SECRET_FILE is a path; AWS_* and the like are not forwarded (dmlc's ssh did).
EXTRA_FORWARD = ("OMP_NUM_THREADS", "KMP_AFFINITY", "LD_LIBRARY_PATH", "PYTHONPATH")
NOT_FORWARDED = frozenset({"PORT", "DMLC_PORT", "DMLC_NODE_HOST", "DMLC_ROLE", "DMLC_PS_ROOT_URI",
                           "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_RANK"})
MXNET_OWN = frozenset({"MXNET_ENGINE_TYPE", "MXNET_MKLDNN_ENABLED"})   # read by ps.mxnet workers only


def config_names() -> list[str]:
    from ps.config import VARIABLES  # the one list of variables ps reads
    return [v.name for v in VARIABLES]


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that remote processes get."""
    names = [n for n in config_names() if n not in NOT_FORWARDED] + list(EXTRA_FORWARD)
    out = {n: environ[n] for n in names if n in environ}
    out.update({k: v for k, v in environ.items() if k.startswith("MXNET_")})
    return out


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment for processes that inherit it (local, local MPI ranks, srun),
    minus per-process settings (a stray PORT or DMLC_NODE_HOST would reach every process)."""
    return {k: v for k, v in environ.items() if k not in NOT_FORWARDED and k not in RESERVED}


def job_env(spec: LaunchSpec, root_uri: str, root_port: int | str,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables every process of the job gets (dmlc tracker's base env), and first on
    PYTHONPATH the MXNet autoload hook unless PS_MXNET_AUTOLOAD=0 (docs/mxnet.md) and ps's
    ``horovod`` package as PS_HOROVOD says (docs/torch.md)."""
    env = {
        "DMLC_NUM_WORKER": str(spec.num_workers),
        "DMLC_NUM_SERVER": str(spec.num_servers),
        "DMLC_PS_ROOT_URI": root_uri,
        "DMLC_PS_ROOT_PORT": str(root_port),
        "DMLC_JOB_CLUSTER": spec.launcher,
        "PYTHONUNBUFFERED": "1",  # children's output reaches the prefixed console line by line
    }
    if spec.max_restarts:
        env["PS_MAX_RESTARTS"] = str(spec.max_restarts)
    environ = {} if environ is None else environ
    first = ([MXNET_AUTOLOAD] if value_of("PS_MXNET_AUTOLOAD", environ) else []) + \
        ([horovod.HOROVOD_PATH] if horovod.wanted(environ) else [])
    if first:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*first, environ.get("PYTHONPATH")) if p)
    return env


def role_env(spec: LaunchSpec, role: str, job: Mapping[str, str]) -> dict[str, str]:
    """Env of every process of ``role`` (rank-free part), user --env* last."""
    return {**job, "DMLC_ROLE": spec.dmlc_role(role), **spec.user_env(role)}


def task_env(spec: LaunchSpec, task: Task, job: Mapping[str, str], node_host: bool = False) -> dict[str, str]:
    """Env of one process: role env plus its task id, pinned rank and (ssh) node host."""
    env = {**job, "DMLC_ROLE": spec.dmlc_role(task.role), "DMLC_TASK_ID": str(task.task_id), "DMLC_RANK": str(task.rank)}
    if node_host and task.host is not None:
        env["DMLC_NODE_HOST"] = task.host.name
    env.update(spec.user_env(task.role))
    return env


# Run by mpi/slurm/sge processes: the rank within the role comes from the cluster manager.
RANK_SCRIPT = (
    'r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}; '
    'if [ -z "$r" ] && [ -n "${SGE_TASK_ID:-}" ]; then r=$((SGE_TASK_ID - 1)); fi; '
    'if [ -n "$r" ]; then DMLC_RANK=$r; DMLC_TASK_ID=$((r + %d)); export DMLC_RANK DMLC_TASK_ID; fi; '
    # not exec: report the exact status (mpirun/srun merge or max them); MPI and srun signal
    # the whole task process group, so the command still gets every signal
    '"$@"; s=$?; [ "$s" -eq 0 ] || echo "%s $s" >&2; exit $s'
)


def rank_wrapper(spec: LaunchSpec, role: str, argv: list[str]) -> list[str]:
    """``sh -c`` prefix that sets DMLC_RANK/DMLC_TASK_ID from the MPI/Slurm/SGE rank."""
    offset = 0 if role == "server" else spec.server_processes
    return ["/bin/sh", "-c", RANK_SCRIPT % (offset, EXIT_MARKER), "ps-launch-rank", *argv]


# --- the scheduler's address -------------------------------------------------------

def scheduler_ip(spec: LaunchSpec, environ: Mapping[str, str]) -> str:
    """--host-ip, else DMLC_INTERFACE's address, else what the job's hosts can reach."""
    if spec.host_ip:
        return spec.host_ip
    if environ.get("DMLC_INTERFACE"):
        return netutil.interface_ip(environ["DMLC_INTERFACE"])
    if spec.launcher == "local" or (spec.launcher in ("ssh", "mpi") and not spec.hosts):
        return "127.0.0.1"
    remote = [h.name for h in spec.hosts if not is_loopback(h.name)]
    if spec.hosts and not remote:
        return "127.0.0.1"
    if remote:
        return netutil.route_source(remote[0])
    return netutil.host_ip()


# --- the scheduler ---------------------------------------------------------------

def scheduler_env(spec: LaunchSpec, ip: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Config mapping of the in-process scheduler: the launcher's ps tunables, --env, DMLC_*."""
    env = {n: environ[n] for n in config_names() if n in environ and n not in NOT_FORWARDED | MXNET_OWN}
    env.update(dict(spec.env))
    env.update({"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": ip, "DMLC_PS_ROOT_PORT": "0",
                "DMLC_NUM_SERVER": str(spec.num_servers), "DMLC_NUM_WORKER": str(spec.num_workers)})
    if spec.max_restarts:
        env["PS_MAX_RESTARTS"] = str(spec.max_restarts)
    if spec.dashboard is not None:
        env["PS_DASHBOARD"] = spec.dashboard
    return env


def default_scheduler_factory(env: Mapping[str, str]) -> Any:
    from ps.config import Config
    from ps.scheduler import Scheduler
    return Scheduler(Config.from_env(env))


class SchedulerRunner:
    """Runs ``Scheduler.run`` in a thread; ``code`` is None while it runs. It is the
    ``launcher.supervise.SchedulerView`` that supervision reads."""

    def __init__(self, sched: Any, port: int):
        self.sched, self.port = sched, port
        self.code: int | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="ps-launch-scheduler", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, env: Mapping[str, str],
              factory: Callable[[Mapping[str, str]], Any] | None = None) -> SchedulerRunner:
        sched = (factory or default_scheduler_factory)(env)
        try:
            port = sched.start()
        except BaseException:
            sched.close()
            raise
        return cls(sched, port)

    def _run(self) -> None:
        try:
            code = self.sched.run(timeout=None)
            self.error = getattr(self.sched, "error", None)
        except Exception as exc:  # a scheduler bug must still end the job
            logger.exception("scheduler failed")
            code, self.error = 1, f"{type(exc).__name__}: {exc}"
        self.code = 1 if code is None else int(code)

    @property
    def done(self) -> bool:
        return self.code is not None

    @property
    def ending(self) -> bool:
        """The scheduler has decided how the job ends, though its van may still linger (up to
        1 s) before ``run`` returns: a node exiting now is part of that end, not to restart."""
        return self.done or getattr(self.sched, "exit_code", None) is not None   # a custom factory may lack it

    @property
    def formed(self) -> bool:
        """``Scheduler.formed`` (a custom factory's scheduler without it counts as formed, so
        that no process's exit is taken for a missing one)."""
        return bool(getattr(self.sched, "formed", True))

    @property
    def ended_well(self) -> bool:
        """The scheduler has decided the job succeeded (``run`` may not have returned yet)."""
        return (self.code if self.done else getattr(self.sched, "exit_code", None)) == 0

    def closed_worker_ranks(self) -> set[int]:
        """``Scheduler.closed_worker_ranks``: workers whose part of the job is over."""
        closed = getattr(self.sched, "closed_worker_ranks", None)   # a custom factory may lack it
        return closed() if closed is not None else set()

    def awaiting_restart(self) -> list[Any]:
        """``Scheduler.awaiting_restart``: dead nodes whose restart has not registered."""
        awaiting = getattr(self.sched, "awaiting_restart", None)   # a custom factory may lack it
        return awaiting() if awaiting is not None else []

    def process_failed(self, name: str, why: str) -> None:
        """The launcher saw ``name`` (``worker 1``) end the job (its dashboard shows it dead)."""
        failed = getattr(self.sched, "process_failed", None)    # a custom factory may lack it
        role, _, rank = name.partition(" ")
        if failed is not None and rank.isdigit():
            failed(role, int(rank), why)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the scheduler now (idempotent) and wait for its thread."""
        try:
            self.sched.close()
        except Exception:
            logger.exception("closing the scheduler failed")
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("scheduler thread did not stop within %.1fs", timeout)
