"""The only place that starts processes.

Every process gets its own session (so its own process group), its output lines are
prefixed with their source (``[worker 1] ...``), and a job is stopped as a whole: SIGTERM
to every process group, a grace period, SIGKILL, then a sweep (psutil) for anything
still in one of the job's groups. Nothing is ever killed by name.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, NamedTuple

import psutil

from ps import childproc

from .output import Labeler, Output, deliver

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Command:
    """One process to start: argv (never a shell string), env and where it runs."""

    name: str  # output prefix and log file stem: "worker 1", "mpirun workers"
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None  # complete environment; None inherits the launcher's
    host: str | None = None
    keep_stdin: bool = False  # ssh: an open stdin pipe; closing it stops the remote side
    stdin_first: bytes = field(default=b"", repr=False)  # written to that pipe at start (ssh: the job key)
    stop_delay: float = 0.0  # a stop lets it end on its own this long before SIGTERM (mpirun)
    label: Labeler | None = field(default=None, compare=False, repr=False)


class Proc:
    """A started Command: the Popen, its reader threads, its exit code once known."""

    def __init__(self, cmd: Command, popen: subprocess.Popen, output: Output,
                 on_exit: Callable[[str, int], None]):
        self.cmd, self.popen, self.output, self.on_exit = cmd, popen, output, on_exit
        self.pgid = popen.pid  # start_new_session: the child leads its own group
        self.code: int | None = None
        self.started = time.monotonic()
        self.ended: float | None = None   # when the launcher saw it exit
        self.readers = [self._reader(popen.stdout, False), self._reader(popen.stderr, True)]

    def _reader(self, stream: IO[bytes] | None, err: bool) -> threading.Thread:
        t = threading.Thread(target=self._pump, args=(stream, err), daemon=True,
                             name=f"ps-launch-out[{self.cmd.name}]")
        t.start()
        return t

    def _pump(self, stream: IO[bytes] | None, err: bool) -> None:
        if stream is None:
            return
        with stream:
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                for source, line in (self.cmd.label(text) if self.cmd.label else [(self.cmd.name, text)]):
                    deliver(self.output, self.on_exit, source, line, err)

    def poll(self) -> int | None:
        if self.code is None:
            rc = self.popen.poll()
            if rc is not None:
                self.code = exit_status(rc)
                self.ended = time.monotonic()
        return self.code

    def close_stdin(self) -> None:
        if self.popen.stdin and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass


class Ended(NamedTuple):
    """How one process of the job ended, for the launcher's closing report."""

    name: str
    status: int | None           # None: still running (a batch task nobody reported)
    seconds: float               # wall time, from its start (or the job's) to its exit
    stopped: bool = False        # it was still running when the launcher stopped the job


def exit_status(returncode: int) -> int:
    """A shell-style status: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _live() -> list[psutil.Process]:
    """Every process of this machine that is not a zombie (one that already exited)."""
    out = []
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(proc)
    return out


def group_members(pgids: Iterable[int]) -> dict[int, list[int]]:
    """pgid -> live (non-zombie) pids in that process group, for the given groups."""
    wanted, found = set(pgids), {}
    for proc in _live():
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:
            continue
        if pgid in wanted:
            found.setdefault(pgid, []).append(proc.pid)
    return found


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``."""
    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                out.append(kid.pid)
        except psutil.Error:
            continue
    return out


def become_subreaper() -> bool:
    """Orphaned descendants (a daemonizing child, ranks of a killed mpirun) are re-parented
    to this process instead of init, so the final sweep still finds them. Linux only."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def run_quiet(argv: list[str], timeout: float, env: Mapping[str, str] | None = None,
              ) -> subprocess.CompletedProcess:
    """A short helper command (rsync, mpirun --version, qdel): output captured, bounded wait."""
    logger.debug("run: %s", " ".join(argv))
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False, timeout=timeout, env=dict(env) if env is not None else None)


def start_group(argv: list[str], env: Mapping[str, str] | None = None, *, tied: bool = False,
                **popen_kw) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new process group, so :func:`stop_group` (or a
    launcher stop) reaches everything it starts, and nothing else. ``tied``: it also gets
    SIGTERM when this process dies, even by SIGKILL, when nothing is left to stop it."""
    start = childproc.popen if tied else subprocess.Popen
    return start(list(argv), env=dict(env) if env is not None else None, start_new_session=True, **popen_kw)


def stop_group(popen: subprocess.Popen, grace: float = 5.0, sig: int = signal.SIGTERM) -> int:
    """``sig`` to ``popen``'s process group, ``grace`` seconds, then SIGKILL to the group;
    returns the leader's exit status. Only for processes :func:`start_group` started."""
    if popen.poll() is None:
        killpg(popen.pid, sig)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    killpg(popen.pid, signal.SIGKILL)     # stragglers of the group, even if the leader is gone
    try:
        return exit_status(popen.wait(5))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"process {popen.pid} ({popen.args!r:.80}) survived SIGKILL for 5s") from None


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Job:
    """A set of processes that live and die together."""

    def __init__(self, output: Output, grace: float = 4.0, kill_wait: float = 3.0,
                 owns_descendants: bool = False):
        """``owns_descendants``: every descendant of this process belongs to the job (the
        CLI, a subreaper); the final sweep then kills all of them, not only the groups."""
        self.output, self.grace, self.kill_wait = output, grace, kill_wait
        self.owns_descendants = owns_descendants
        self.procs: list[Proc] = []
        self.started = time.monotonic()
        self.reported: dict[str, Ended] = {}     # exits observed by other means (batch tasks)
        self._stopped: set[str] = set()          # names still running when stop() began
        self._stopped_procs: set[int] = set()    # id() of the processes still running then
        self._events: queue.SimpleQueue = queue.SimpleQueue()  # (name, code) from non-Popen sources
        # id() of each process whose exit poll() has handed out. Not Proc.code: any look at a
        # process (``running``, ``_wait``) records its exit, and an exit seen there first must
        # still reach poll(), or a killed node is neither restarted nor reported.
        self._exits_given: set[int] = set()
        self._stop_hooks: list[Callable[[], None]] = []
        self._cleanups: list[Callable[[], None]] = []

    def spawn(self, cmd: Command) -> Proc:
        logger.debug("start %s: %s", cmd.name, " ".join(cmd.argv))
        # tied: a launcher killed by SIGKILL (an OOM kill, a lost session) takes its nodes along
        popen = start_group(cmd.argv, cmd.env, tied=True,
                            stdin=subprocess.PIPE if cmd.keep_stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc = Proc(cmd, popen, self.output, self.report_exit)
        self.procs.append(proc)
        if cmd.stdin_first and popen.stdin is not None:
            try:
                popen.stdin.write(cmd.stdin_first)
                popen.stdin.flush()
            except OSError as exc:   # it died at once; its exit status tells the rest
                logger.debug("%s: could not write its stdin: %s", cmd.name, exc)
        return proc

    def add_stop_hook(self, hook: Callable[[], None]) -> None:
        """Called once at the start of stop() (e.g. qdel of a batch job)."""
        self._stop_hooks.append(hook)

    def add_cleanup(self, fn: Callable[[], None]) -> None:
        """Called by close(), once every process has ended (remove a scratch directory)."""
        self._cleanups.append(fn)

    def report_exit(self, name: str, code: int) -> None:
        """An exit observed by other means (a batch task's status file)."""
        self._events.put((name, code))

    def poll(self) -> list[tuple[str, int]]:
        """(name, exit status) of everything that ended since the last poll."""
        ended = []
        for proc in self.procs:
            if id(proc) not in self._exits_given and proc.poll() is not None:
                self._exits_given.add(id(proc))
                ended.append((proc.cmd.name, proc.code))
        while True:
            try:
                name, code = self._events.get_nowait()
            except queue.Empty:
                return ended
            ended.append((name, code))
            self.reported.setdefault(name, Ended(name, code, time.monotonic() - self.started))

    def ends(self) -> list[Ended]:
        """Every process's (and reported task's) exit status and wall time, in start order."""
        self.poll()
        now = time.monotonic()
        out = [Ended(p.cmd.name, p.poll(), (p.ended or now) - p.started, id(p) in self._stopped_procs)
               for p in self.procs]
        own = {p.cmd.name for p in self.procs}
        out += [e._replace(stopped=e.name in self._stopped) for e in self.reported.values() if e.name not in own]
        return out

    def latest(self) -> dict[str, Proc]:
        """The newest process of each name: a restart stands for its dead self."""
        return {p.cmd.name: p for p in self.procs}

    @property
    def running(self) -> list[Proc]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self, after_failure: bool = False) -> None:
        """TERM everything, wait ``grace``, KILL what is left, sweep the job's groups.

        ``after_failure``: a process failed, so a Command with ``stop_delay`` may already be
        tearing its own processes down (mpirun); it gets that long before the TERM."""
        hooks, self._stop_hooks = self._stop_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:
                logger.exception("stop hook failed")
        running = self.running
        self._stopped.update(p.cmd.name for p in running)
        self._stopped_procs.update(id(p) for p in running)
        delayed = [p for p in running if p.cmd.stop_delay and after_failure]
        self._terminate([p for p in running if p not in delayed])
        if delayed:
            self._wait(max(p.cmd.stop_delay for p in delayed), delayed)
            self._terminate([p for p in delayed if p.poll() is None])
        self._wait(self.grace)
        for proc in self.running:
            logger.debug("%s did not stop within %.1fs: SIGKILL", proc.cmd.name, self.grace)
            killpg(proc.pgid, signal.SIGKILL)
        self._wait(self.kill_wait)
        self.sweep()

    def sweep(self) -> None:
        """KILL stray members of the job's process groups (children of exited processes)."""
        # a group with a live member keeps its id, so killpg cannot hit a recycled group
        for pgid, pids in group_members(p.pgid for p in self.procs).items():
            logger.debug("killing leftover process(es) %s of group %d", pids, pgid)
            killpg(pgid, signal.SIGKILL)
        if self.owns_descendants:
            own = {p.popen.pid for p in self.procs}
            for pid in descendants(os.getpid()):
                logger.debug("killing leftover process %d", pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if pid not in own:  # an orphan re-parented to us: reap it (never a Popen's child)
                    _reap_later(pid)

    @staticmethod
    def _terminate(procs: list[Proc]) -> None:
        for proc in procs:
            if proc.cmd.keep_stdin:
                proc.close_stdin()  # the remote watchdog TERMs, then KILLs, the remote group
            else:
                killpg(proc.pgid, signal.SIGTERM)

    def _wait(self, timeout: float, procs: list[Proc] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in (self.procs if procs is None else procs)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self, timeout: float = 2.0) -> None:
        """Join the output readers (after the processes ended)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.close_stdin()
            for t in proc.readers:
                t.join(max(0.0, deadline - time.monotonic()))
        cleanups, self._cleanups = self._cleanups, []
        for fn in cleanups:
            try:
                fn()
            except Exception:
                logger.exception("cleanup failed")


def _reap_later(pid: int, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.02)


class StopSignal:
    """Set by SIGINT/SIGTERM (or a test); the supervisor then stops the job.

    A plain attribute, not a ``threading.Event``: the handler runs in the main thread between
    two bytecodes, possibly while that thread holds the Event's lock inside ``wait()``, and
    ``Event.set()`` would then wait for that lock forever (a launcher deaf to Ctrl-C)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def set(self, signum: int = signal.SIGTERM) -> None:
        if self.signum is None:
            self.signum = signum

    def is_set(self) -> bool:
        return self.signum is not None

    def install(self) -> Callable[[], None]:
        """Route SIGINT/SIGTERM/SIGHUP here (main thread only); returns a restore function."""
        def handler(signum: int, frame: object) -> None:
            self.set(signum)  # no logging here: the main thread may hold the output lock
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

        def restore() -> None:
            for sig, previous in old.items():
                signal.signal(sig, previous)
        return restore

    @property
    def code(self) -> int:
        return 128 + (self.signum or signal.SIGTERM)


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

    def stop_unreachable(self, job: Job, sched: object | None, grace: float = 1.0) -> None:
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
        for dead in getattr(sched, "awaiting_restart", lambda: [])():
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

    def take(self, job: Job, ended: list[tuple[str, int]], sched: object | None) -> list[tuple[str, int]]:
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


def _closed_its_store(name: str, sched: object | None) -> bool:
    """``worker R`` has closed its store (the scheduler counts it as finished)."""
    rank = name.split(" ")[-1]
    closed = getattr(sched, "closed_worker_ranks", None)    # a test's stub scheduler may lack it
    return _role(name) == "worker" and rank.isdigit() and closed is not None and int(rank) in closed()


def _how(status: int) -> str:
    if status > 128 and status - 128 in signal.valid_signals():
        return f"was killed by {signal.Signals(status - 128).name}"
    return f"exited with status {status}"


def supervise(job: Job, sched: object | None = None, stop: StopSignal | None = None,
              timeout: float | None = None, settle: float = 10.0, restarts: Restarts | None = None) -> int:
    """Wait for the job; return the first non-zero exit status (0 if none), then stop the rest.

    ``sched`` is the in-process scheduler runner (``done``, ``ending``, ``code``, ``error``,
    ``close()``).
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
            code = _first_failure(restarts.take(job, _after_the_work(job, job.poll(), sched), sched))
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


def _work_done(job: Job, sched: object | None) -> bool:
    """Every worker has exited 0, or the scheduler ended the job as a success (every worker
    closed its store and the servers were told to stop)."""
    if sched is not None and getattr(sched, "ended_well", False):
        return True
    workers = [proc for name, proc in job.latest().items() if _role(name) == "worker"]
    return bool(workers) and all(proc.poll() == 0 for proc in workers)


def _after_the_work(job: Job, ended: list[tuple[str, int]], sched: object | None) -> list[tuple[str, int]]:
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


def report_ends(ends: list[Ended], sched: object | None, seconds: float) -> None:
    """One line per process: how it ended and how long it ran (the scheduler's is the job's)."""
    if sched is not None:
        code = getattr(sched, "code", None)
        ends = [Ended("scheduler", code, seconds), *ends]
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


def _first_failure(ended: list[tuple[str, int]]) -> int:
    for name, status in ended:
        if status:
            logger.error("%s exited with status %d: stopping the job", name, status)
            return status
        logger.debug("%s exited with status 0", name)
    return 0


def _scheduler_failure(job: Job, sched: object, wait: float = 1.0) -> int:
    """The scheduler saw a node fail: prefer that node's own exit status if it shows up."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        code = _first_failure(job.poll())
        if code:
            return code
        time.sleep(0.05)
    logger.error("scheduler: %s", getattr(sched, "error", None) or "the job failed")
    return int(getattr(sched, "code", 1) or 1)
