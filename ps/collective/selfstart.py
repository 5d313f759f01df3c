"""Horovod's way of launching, on ps: ``mpirun -np 4 python train.py`` or ``srun -n 4 python
train.py``, no ``python -m ps.launch``.

A rank that mpirun or srun started (``ps.config.manager_rank``) with no ``DMLC_ROLE`` makes the
rendezvous itself before its store joins: rank 0 starts the scheduler, rank r starts server r
(one server per rank unless ``DMLC_NUM_SERVER`` says otherwise), each as a ``python -m ps``
child that dies with its rank; then the rank is worker r. For MXNet's ``dist_sync_mpi`` every
rank is joint instead (``start(joint=True)``): worker r and server r in the one process. The scheduler's address is
127.0.0.1 when every rank is on one host, the first host of a Slurm step, or
``DMLC_PS_ROOT_URI``; its port is derived from the job's id (the same in every rank) unless
``DMLC_PS_ROOT_PORT`` is set. Derived ports lie below Linux's default ephemeral range
(32768-60999): there, any process's outgoing connection may hold the port, and the ranks cannot
agree on another one. Rank 0 waits until its scheduler listens, so a port that is taken anyway
fails that rank at once, naming the port, instead of leaving every rank waiting for a scheduler
that is gone.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping

import psutil

from .. import childproc, netutil
from .._timing import Deadline
from ..config import ManagerRank, manager_rank
from ..errors import ConfigError

logger = logging.getLogger(__name__)

CHILD_EXIT_WAIT = 15.0     # seconds the scheduler and servers get to end on their own after the worker
LISTEN_WAIT = 60.0         # seconds rank 0 gives its scheduler to bind (python -m ps imports numpy, zmq)


def needed(environ: Mapping[str, str] | None = None) -> ManagerRank | None:
    """This process's mpirun/srun rank when it must start its part of the job itself."""
    env = os.environ if environ is None else environ
    if "DMLC_ROLE" in env:          # started by ps.launch, or by hand: told who it is
        return None
    return manager_rank(env)


def rendezvous(rank: ManagerRank, environ: Mapping[str, str]) -> dict[str, str]:
    """The DMLC_* variables every process of the job agrees on, computed in each rank alone."""
    root = environ.get("DMLC_PS_ROOT_URI")
    if not root:
        if not rank.multi_host:
            root = "127.0.0.1"
        elif rank.nodelist:
            root = netutil.resolve(_first_host(rank.nodelist))
        else:
            raise ConfigError(f"{rank.manager} started ranks on several hosts: set DMLC_PS_ROOT_URI to rank 0's "
                              "host in every rank (mpirun -x DMLC_PS_ROOT_URI=<host of rank 0>)")
    port = environ.get("DMLC_PS_ROOT_PORT")
    if not port:
        if not rank.job_id:
            raise ConfigError(f"{rank.manager} gives no job id to derive the scheduler's port from: set "
                              "DMLC_PS_ROOT_PORT in every rank")
        ports = netutil.CHOSEN_PORTS         # under the kernel's ephemeral ports
        port = str(ports[int(hashlib.sha256(rank.job_id.encode()).hexdigest(), 16) % len(ports)])
    return {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": port, "DMLC_NUM_WORKER": str(rank.size),
            "DMLC_NUM_SERVER": environ.get("DMLC_NUM_SERVER") or str(rank.size)}


def _first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``node[1-3],x`` -> node1), as scontrol expands it."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"cannot expand SLURM_STEP_NODELIST={nodelist!r} with scontrol ({exc}): set "
                          "DMLC_PS_ROOT_URI to rank 0's host") from None
    if not out:
        raise ConfigError(f"SLURM_STEP_NODELIST={nodelist!r} names no host")
    return out[0]


def start(environ: Mapping[str, str] | None = None, joint: bool = False) -> ManagerRank | None:
    """Under mpirun/srun: start this rank's scheduler and servers, and make this process its
    worker (its DMLC_* variables set in ``os.environ``). None when not needed.

    ``joint``: every rank is a joint process (``DMLC_ROLE=joint``, ps/joint.py), its server
    shard on its own threads, so no server process is started (MXNet's ``dist_sync_mpi``)."""
    rank = needed(environ)
    if rank is None:
        return None
    base = rendezvous(rank, os.environ)
    if joint:
        given = os.environ.get("DMLC_NUM_SERVER")
        if given and given != str(rank.size):
            raise ConfigError(f"DMLC_NUM_SERVER={given}: in a job of joint ranks every one of the {rank.size} "
                              f"ranks holds one server shard; unset DMLC_NUM_SERVER")
        base["DMLC_NUM_SERVER"] = str(rank.size)
    children = []
    atexit.register(_reap, children)
    if rank.rank == 0:
        children.append(_spawn("scheduler", base, None))
    for server in range(rank.rank, 0 if joint else int(base["DMLC_NUM_SERVER"]), rank.size):
        children.append(_spawn("server", base, server))
    if rank.rank == 0:
        try:
            _await_listening(children[0], int(base["DMLC_PS_ROOT_PORT"]), rank, "DMLC_PS_ROOT_PORT" in os.environ)
        except ConfigError:
            _reap(children, wait=0.0)
            raise
    os.environ.update(base, DMLC_ROLE="joint" if joint else "worker", DMLC_RANK=str(rank.rank))
    logger.info("%s rank %d of %d: scheduler %s:%s, %s", rank.manager, rank.rank, rank.size,
                base["DMLC_PS_ROOT_URI"], base["DMLC_PS_ROOT_PORT"],
                "a joint rank" if joint else f"{len(children) - (rank.rank == 0)} server(s) started here")
    return rank


def _await_listening(scheduler: subprocess.Popen, port: int, rank: ManagerRank, port_given: bool) -> None:
    """Until the scheduler this rank started listens on ``port``; a ConfigError naming the port
    when it exits first (it said why on stderr: most often the port is taken)."""
    deadline = Deadline(LISTEN_WAIT)
    while not deadline.expired:
        code = scheduler.poll()
        if code is not None:
            origin = ("DMLC_PS_ROOT_PORT" if port_given
                      else f"derived from {rank.manager}'s job id {rank.job_id!r}")
            raise ConfigError(f"the scheduler rank 0 started on port {port} ({origin}) exited with code {code} "
                              "before it listened (its error is above; most often the port is taken): set "
                              "DMLC_PS_ROOT_PORT to a free port in every rank")
        if _listens(scheduler.pid, port):
            return
        time.sleep(0.05)
    raise ConfigError(f"the scheduler rank 0 started (pid {scheduler.pid}) did not listen on port {port} "
                      f"within {LISTEN_WAIT:g}s")


def _listens(pid: int, port: int) -> bool:
    try:
        return port in netutil.listen_ports(pid)
    except psutil.NoSuchProcess:
        return False            # it exited: the caller's poll() says with what
    except psutil.Error:
        return True             # /proc hidden from us: go on, as before this check existed


def _spawn(role: str, base: dict[str, str], rank: int | None) -> subprocess.Popen:
    env = {**os.environ, **base, "DMLC_ROLE": role}
    if rank is not None:
        env["DMLC_RANK"] = str(rank)
    return childproc.popen([sys.executable, "-m", "ps"], env=env, stdin=subprocess.DEVNULL)


def _reap(children: list[subprocess.Popen], wait: float = CHILD_EXIT_WAIT) -> None:
    """At the worker's exit (after its store closed): the servers and the scheduler end once
    every worker closed; wait for that, then stop what is left."""
    deadline = time.monotonic() + wait
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
