"""Job policy: how long the launcher lets a job run, which failed processes it starts again
(``--max-restarts``), when a failure ends the job, and the closing report.

The processes themselves are launcher/process.py's; what supervision knows of the job's
scheduler is exactly :class:`SchedulerView`, which ``launcher.tracker.SchedulerRunner``
(the in-process ``ps.scheduler.Scheduler``) gives.
"""
from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .process import Command, Ended, Job, StopSignal, killpg

if TYPE_CHECKING:
    from ps.membership import Awaited

logger = logging.getLogger(__name__)


@runtime_checkable
class SchedulerView(Protocol):
    """What supervision reads of the job's scheduler while it runs the job (a test's stub
    scheduler gives all of it too: isinstance checks that a stub has every member)."""

    @property
    def done(self) -> bool:
        """The scheduler's ``run`` has returned: ``code`` is its status."""

    @property
    def ending(self) -> bool:
        """It has decided how the job ends: a node exiting now is part of that end."""

    @property
    def ended_well(self) -> bool:
        """It has decided that the job succeeded (every worker closed its store)."""

    @property
    def formed(self) -> bool:
        """Every node has registered and has its table: a process that leaves before this
        leaves a place the job cannot fill."""

    @property
    def code(self) -> int | None:
        """Its exit status; None while it runs."""

    @property
    def error(self) -> str | None:
        """Why the job failed, as the scheduler saw it."""

    def closed_worker_ranks(self) -> set[int]:
        """Workers whose part of the job is over: a failure after that is not restarted."""

    def awaiting_restart(self) -> list[Awaited]:
        """Nodes it declared dead whose restart has not registered yet."""

    def close(self) -> None:
        """Stop it now (idempotent)."""


# where a restart runs: (the dead process's command, how it ended, the job) -> the command to start
Relocate = Callable[[Command, int, bool, "Job"], Command]


class Restarts:
    """``--max-restarts``: how many failed servers and workers the launcher may start again."""

    def __init__(self, limit: int = 0, relocate: Relocate | None = None):
        """``relocate``: the backend's choice of host for a restart (ssh: another host when
        the dead one's host does not answer); None restarts every command as it was."""
        self.limit, self.used = limit, 0
        self.relocate = relocate
        self.unreachable: set[int] = set()   # id() of processes stopped as unreachable (stop_unreachable)

    def stop_unreachable(self, job: Job, sched: SchedulerView | None, grace: float = 1.0) -> None:
        """A node the scheduler declared dead (no heartbeat: its host lost power or its network)
        whose process still runs here is an ssh client waiting on a silent host, or a hung
        process: neither can come back into the job (the scheduler has given its place to a
        restart), so stop it now and let take() start it again, instead of waiting for the
        restart that never comes until PS_CONNECT_TIMEOUT. ``grace``: a node that died
        normally exits here within moments of the scheduler noticing (its ssh client too: the
        remote sshd closes the session as the scheduler sees the connection close, and the
        scheduler declares a closed connection dead only 2 s later). Every second of it is a
        second longer that the job waits for a machine that is gone."""
        if not self.limit or sched is None:
            return
        for dead in sched.awaiting_restart():
            if dead.waited < grace:
                continue
            name = f"{dead.role} {dead.rank}"
            proc = job.latest().get(name)
            if proc is None or proc.poll() is not None or id(proc) in self.unreachable \
                    or proc.started > time.monotonic() - dead.lived:      # a restart, still starting
                continue
            logger.warning("%s is dead to the scheduler (%s) but its process here (%s) still runs: "
                           "stopping it so it can be started again", name, dead.reason,
                           f"ssh to {proc.cmd.host}" if proc.cmd.keep_stdin else f"pid {proc.popen.pid}")
            self.unreachable.add(id(proc))
            killpg(proc.pgid, signal.SIGKILL)

    def take(self, job: Job, ended: list[tuple[str, int]], sched: SchedulerView | None) -> list[tuple[str, int]]:
        """Start again each failed server or worker while restarts last; the exits it did not take."""
        left = []
        for name, status in ended:
            proc = job.latest().get(name)
            if not status or proc is None or name.split(" ")[0] not in ("server", "worker") \
                    or (sched is not None and sched.ending):
                left.append((name, status))
                continue
            if self.limit and _closed_its_store(name, sched):
                # its script failed after (or while) it ended its part: a restart would re-run
                # a script whose store the job already counts as closed, and wait for a
                # scheduler that may be gone by then (PS_CONNECT_TIMEOUT) before failing anyway
                logger.error("%s %s after it closed its store: not started again, the job fails", name,
                             _how(status))
                left.append((name, status))
                continue
            if self.used >= self.limit:
                if self.limit:
                    logger.error("%s %s; the job has used all of its %d restart(s) (--max-restarts)",
                                 name, _how(status), self.limit)
                left.append((name, status))
                continue
            self.used += 1
            how = "was unreachable" if id(proc) in self.unreachable else _how(status)
            logger.warning("%s %s: starting it again (restart %d of %d)", name, how, self.used, self.limit)
            cmd = proc.cmd
            if self.relocate is not None:
                cmd = self.relocate(cmd, status, id(proc) in self.unreachable, job)
            job.spawn(cmd)
        return left


def _closed_its_store(name: str, sched: SchedulerView | None) -> bool:
    """``worker R`` has closed its store (the scheduler counts it as finished)."""
    rank = name.split(" ")[-1]
    return (_role(name) == "worker" and rank.isdigit() and sched is not None
            and int(rank) in sched.closed_worker_ranks())


def _how(status: int) -> str:
    if status > 128 and status - 128 in signal.valid_signals():
        return f"was killed by {signal.Signals(status - 128).name}"
    return f"exited with status {status}"


def supervise(job: Job, sched: SchedulerView | None = None, stop: StopSignal | None = None,
              timeout: float | None = None, settle: float = 10.0, restarts: Restarts | None = None) -> int:
    """Wait for the job; return the first non-zero exit status (0 if none), then stop the rest.

    ``sched`` is the in-process scheduler runner (:class:`SchedulerView`).
    A failing process wins over the scheduler's own failure report, which usually follows it.
    ``restarts``: failed servers and workers are started again while it lasts (the scheduler
    decides whether the job can wait for them).
    """
    stop = stop or StopSignal()
    restarts = restarts or Restarts()
    start = time.monotonic()
    idle_since: float | None = None
    code, failed = 0, False
    try:
        while True:
            if stop.is_set():  # before take(): nodes killed with the launcher are not restarted
                logger.warning("%s: stopping the job", signal.Signals(stop.signum or signal.SIGTERM).name)
                code = stop.code
                break
            restarts.stop_unreachable(job, sched)
            idle = not job.running   # looked at before poll(), so poll() hands out what this saw end
            ended = restarts.take(job, _after_the_work(job, job.poll(), sched), sched)
            code = _first_failure(ended, sched) or _left_unformed(ended, sched)
            if code:
                failed = True
                break
            if sched is not None and sched.done and sched.code:
                code, failed = _scheduler_failure(job, sched), True
                break
            now = time.monotonic()
            if idle and not job.running:     # not job.running: take() may have started one again
                if sched is None or sched.done:
                    break
                idle_since = idle_since or now
                if now - idle_since > settle:
                    logger.warning("every process exited but the scheduler did not finish within %.0fs", settle)
                    break
            if timeout is not None and now - start > timeout:
                logger.error("the job ran longer than --timeout %gs: stopping it", timeout)
                code = 124
                break
            time.sleep(0.1)   # a signal's handler runs inside it (PEP 475 resumes the sleep)
    finally:
        job.stop(after_failure=failed)
        if sched is not None:
            sched.close()
        job.close()
        report_ends(job.ends(), sched, time.monotonic() - start)
    return code


def _role(name: str) -> str:
    """``server 1`` -> server; ``mpirun workers`` -> worker."""
    words = name.split(" ")
    return words[0] if words[0] in ("server", "worker") else words[-1].rstrip("s")


def _work_done(job: Job, sched: SchedulerView | None) -> bool:
    """Every worker has exited 0, or the scheduler ended the job as a success (every worker
    closed its store and the servers were told to stop)."""
    if sched is not None and sched.ended_well:
        return True
    workers = [proc for name, proc in job.latest().items() if _role(name) == "worker"]
    return bool(workers) and all(proc.poll() == 0 for proc in workers)


def _after_the_work(job: Job, ended: list[tuple[str, int]], sched: SchedulerView | None) -> list[tuple[str, int]]:
    """Drop the failures of servers that died once the job's work was done: nothing is lost
    (a server SIGKILLed while it shuts down), so the job must not be reported failed, nor the
    server started again. A worker's own failure always counts."""
    late = [(name, status) for name, status in ended if status and _role(name) == "server"]
    if not late or not _work_done(job, sched):
        return ended
    for name, status in late:
        logger.warning("%s %s after every worker had finished: the job's work is done, so this is "
                       "not a failure", name, _how(status))
    return [e for e in ended if e not in late]


def report_ends(ends: list[Ended], sched: SchedulerView | None, seconds: float) -> None:
    """One line per process: how it ended and how long it ran (the scheduler's is the job's)."""
    if sched is not None:
        ends = [Ended("scheduler", sched.code, seconds), *ends]
    if len(ends) > 16:                 # a big job: one line per role instead
        ends = _per_role(ends)
    width = max((len(e.name) for e in ends), default=0)
    for e in ends:
        if e.status is None:
            how = "no exit status seen"
        elif e.stopped:
            how = f"stopped by the launcher (status {e.status})"
        elif e.status > 128 and e.status - 128 in signal.valid_signals():
            how = f"killed by {signal.Signals(e.status - 128).name} (status {e.status})"
        else:
            how = f"exit {e.status}"
        logger.info("%-*s  %s after %.1fs", width, e.name, how, e.seconds)


def _per_role(ends: list[Ended]) -> list[Ended]:
    """Collapse each role's processes into one line: the worst status, the longest wall time."""
    groups: dict[str, list[Ended]] = {}
    for e in ends:
        groups.setdefault(e.name.split(" ")[0], []).append(e)
    out = []
    for role, members in groups.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        failed = [e for e in members if e.status]
        worst = failed[0] if failed else members[0]
        label = f"{role}s ({len(members)}; {len(failed)} failed, first {worst.name})" if failed \
            else f"{role}s ({len(members)})"
        out.append(Ended(label, worst.status, max(e.seconds for e in members), worst.stopped))
    return out


def _first_failure(ended: list[tuple[str, int]], sched: SchedulerView | None = None) -> int:
    for name, status in ended:
        if status:
            logger.error("%s exited with status %d: stopping the job", name, status)
            _tell(sched, name, f"{name} {_how(status)}")
            return status
        logger.debug("%s exited with status 0", name)
    return 0


def _left_unformed(ended: list[tuple[str, int]], sched: SchedulerView | None) -> int:
    """A worker or server that exits cleanly before the cluster formed: the others would wait
    for it until PS_CONNECT_TIMEOUT, so the job ends now, naming it. (A script that creates
    its store on some ranks only, or not at all.)"""
    if sched is None or sched.formed or sched.ending:
        return 0
    for name, status in ended:
        role = _role(name)
        if status == 0 and role in ("worker", "server"):
            why = "its script ended without creating a dist kvstore" if role == "worker" else \
                "a server runs until the job ends"
            logger.error("%s exited with status 0 before the cluster formed (%s): the job cannot form "
                         "without it; stopping the job", name, why)
            _tell(sched, name, f"{name} exited before the cluster formed")
            return 1
    return 0


def _tell(sched: SchedulerView | None, name: str, why: str) -> None:
    """The scheduler's dashboard shows ``name`` dead for ``why``."""
    failed = getattr(sched, "process_failed", None)     # a test's stub may lack it
    if failed is not None:
        failed(name, why)


def _scheduler_failure(job: Job, sched: SchedulerView, wait: float = 1.0) -> int:
    """The scheduler saw a node fail: prefer that node's own exit status if it shows up."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        code = _first_failure(job.poll())
        if code:
            return code
        time.sleep(0.05)
    logger.error("scheduler: %s", sched.error or "the job failed")
    return int(sched.code or 1)
