"""The only place that starts processes.

Every process gets its own session (so its own process group), its output lines are
prefixed with their source (``[worker 1] ...``), and a job is stopped as a whole: SIGTERM
to every process group, a grace period, SIGKILL, then a sweep (psutil) for anything
still in one of the job's groups. Nothing is ever killed by name. What a failure does to
the job (a restart, the end of it) is launcher/supervise.py's to decide.
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
