"""process.py and launch.run() with plain `python -c` processes and a stub scheduler:
prefixes, exit status, fail-fast, stop on a signal, TERM -> KILL, leftovers."""
from __future__ import annotations

import io
import os
import sys
import threading
import time
from dataclasses import replace

import pytest

from launcher.launch import parse_args, run
from launcher.output import EXIT_MARKER, Output
from launcher.process import Command, Job, StopSignal, group_members
from launcher.supervise import Restarts, SchedulerView, supervise
from launcher.tracker import SchedulerRunner

from tests.helpers import alive, poll_for

pytestmark = pytest.mark.process

PY = sys.executable


class StubScheduler:
    """Stands in for ps.scheduler.Scheduler: run() blocks until close() or finish(), then for
    ``linger`` seconds more, as the real one's van lingers after it decided the job's end."""

    def __init__(self, env, linger: float = 0.0):
        self.env, self.error, self.code, self.exit_code = dict(env), None, 0, None
        self.linger = linger
        self._done = threading.Event()

    def start(self) -> int:
        return 45678

    def run(self, timeout=None) -> int:
        self._done.wait(60)
        time.sleep(self.linger)
        return self.code

    def finish(self, code: int, error: str | None = None) -> None:
        self.code, self.exit_code, self.error = code, code, error
        self._done.set()

    def close(self) -> None:
        if not self._done.is_set():
            self.finish(1, "the scheduler was stopped")


def py(code: str) -> tuple[str, ...]:
    return (PY, "-c", code)


def make_job(grace: float = 4.0):
    out, err = io.StringIO(), io.StringIO()
    return Job(Output(stdout=out, stderr=err), grace=grace, kill_wait=2.0), out, err


def test_prefixed_output_log_files_and_success(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    job = Job(Output(str(tmp_path), out, err))
    job.spawn(Command("worker 0", py("import sys; print('a'); print('b', file=sys.stderr); print('c')")))
    job.spawn(Command("server 0", py("print('s')")))
    assert supervise(job) == 0
    assert sorted(out.getvalue().splitlines()) == ["[server 0] s", "[worker 0] a", "[worker 0] c"]
    assert err.getvalue() == "[worker 0] b\n"
    assert sorted((tmp_path / "worker-0.log").read_text().splitlines()) == ["a", "b", "c"]


def test_an_exit_seen_first_by_another_look_at_the_job_is_still_reported():
    """supervise() looks at ``job.running`` between polls; a node that died just before that
    look must still come out of the next poll(), or --max-restarts never restarts it and the
    job waits for the scheduler to give up (a CI run lost a SIGKILLed server this way)."""
    job, _, _ = make_job()
    job.spawn(Command("server 1", py("raise SystemExit(137)")))
    assert poll_for(lambda: not job.running, 10)       # this look records the exit first
    assert job.poll() == [("server 1", 137)]
    assert job.poll() == []                            # handed out once


def test_the_last_process_failing_between_two_looks_fails_the_job():
    """The last process exits while supervise() is between poll() and its look at
    ``job.running`` (here: a poll() that takes a second after its scan): its status is still
    the job's, not 0."""
    class SlowPoll(Job):
        def poll(self):
            ended = super().poll()
            time.sleep(1.0)
            return ended

    job = SlowPoll(Output(stdout=io.StringIO(), stderr=io.StringIO()))
    job.spawn(Command("worker 0", py("import time; time.sleep(0.4); raise SystemExit(3)")))
    assert supervise(job) == 3


def test_nodes_that_die_with_a_stopped_launcher_are_not_restarted():
    """A TERM to the whole job (scancel, systemd) kills the nodes and the launcher together:
    the launcher stops instead of spending --max-restarts on them."""
    job, _, _ = make_job()
    node = job.spawn(Command("worker 0", py("raise SystemExit(143)")))
    assert poll_for(lambda: node.popen.poll() is not None, 10)
    stop = StopSignal()
    stop.set(15)
    assert supervise(job, stop=stop, restarts=Restarts(2)) == 143
    assert len(job.procs) == 1


def test_first_failure_wins_and_the_rest_is_stopped():
    job, _, _ = make_job()
    sleeper = job.spawn(Command("server 0", py("import time; time.sleep(60)")))
    job.spawn(Command("worker 1", py("import time; time.sleep(0.3); raise SystemExit(3)")))
    job.spawn(Command("worker 0", py("import time; time.sleep(1.5); raise SystemExit(4)")))
    t0 = time.monotonic()
    assert supervise(job) == 3
    assert time.monotonic() - t0 < 5
    assert sleeper.code == 128 + 15 and not alive(sleeper.popen.pid)


def test_stop_signal_term_then_kill():
    job, out, _ = make_job(grace=0.5)
    stubborn = job.spawn(Command("worker 0", py(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "time.sleep(60)")))
    assert poll_for(lambda: "[worker 0] up" in out.getvalue(), 20)   # it ignores TERM from here on
    stop = StopSignal()
    threading.Timer(0.5, stop.set, args=(2,)).start()
    t0 = time.monotonic()
    assert supervise(job, stop=stop) == 130
    assert time.monotonic() - t0 < 4
    assert stubborn.code == 128 + 9


def test_leftover_child_in_the_group_is_swept():
    job, out, _ = make_job()
    proc = job.spawn(Command("worker 0", py(
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(p.pid, flush=True)")))
    assert supervise(job) == 0
    child = int(out.getvalue().split()[-1])
    assert poll_for(lambda: group_members([proc.pgid]) == {} and not alive(child), 2)


def test_exit_marker_reports_a_task_status():
    job, _, _ = make_job()
    job.spawn(Command("mpirun workers", py(f"import sys, time; print('{EXIT_MARKER} 9', file=sys.stderr, "
                                           "flush=True); time.sleep(60)"),
                      label=lambda line: [("worker 2", line)]))
    assert supervise(job) == 9


def test_timeout():
    job, _, _ = make_job()
    job.spawn(Command("worker 0", py("import time; time.sleep(60)")))
    assert supervise(job, timeout=0.5) == 124


def spec(*argv):
    s = parse_args(["-n", "2", "-s", "1", *argv], os.environ, python=PY)
    return replace(s, server_command=py("import time; time.sleep(60)"))


def test_run_with_stub_scheduler_scheduler_failure():
    """The scheduler ends the job with an error while every process still runs: status 1."""
    scheds = []

    def factory(env):
        scheds.append(StubScheduler(env))
        threading.Timer(0.5, scheds[-1].finish, args=(1, "worker 1 died")).start()
        return scheds[-1]
    out, err = io.StringIO(), io.StringIO()
    code = run(spec(*py("import time; time.sleep(60)")), scheduler_factory=factory, output=Output(None, out, err))
    assert code == 1
    assert "[launcher] scheduler: worker 1 died" in err.getvalue()
    assert scheds[0].env["DMLC_ROLE"] == "scheduler" and scheds[0].env["DMLC_PS_ROOT_PORT"] == "0"
    assert "[launcher] 1 server, 2 workers on 1 host; scheduler 127.0.0.1:45678" in out.getvalue()


def test_a_node_exiting_while_the_scheduler_lingers_on_its_failure_is_not_restarted(tmp_path):
    """The scheduler declared the job failed (a worker lost) and its van lingers before run()
    returns; the nodes it aborted exit meanwhile. --max-restarts must not start them again."""
    scheds = []
    starts = tmp_path / "starts"

    def factory(env):
        scheds.append(StubScheduler(env, linger=3.0))
        threading.Timer(0.5, scheds[-1].finish, args=(1, "worker 1 died")).start()
        return scheds[-1]
    worker = py(f"import time; open({str(starts)!r}, 'a').write('x'); "
                "time.sleep(1.0); raise SystemExit(1)")
    out, err = io.StringIO(), io.StringIO()
    code = run(spec("--max-restarts", "2", *worker), scheduler_factory=factory, output=Output(None, out, err))
    assert code == 1
    assert starts.read_text() == "xx", err.getvalue()      # the two first starts, no restart
    assert "starting it again" not in err.getvalue()


def test_run_with_stub_scheduler_success_and_env():
    scheds = []

    def factory(env):
        scheds.append(StubScheduler(env))
        return scheds[-1]
    out, err = io.StringIO(), io.StringIO()
    worker = py("import os; print(os.environ['DMLC_PS_ROOT_PORT'], os.environ['DMLC_RANK'], "
                "os.environ.get('ONLY_S'))")
    s = replace(spec("--env-server", "ONLY_S:1", *worker), server_command=py("print('server done')"))
    threading.Timer(1.0, lambda: scheds[0].finish(0)).start()
    assert run(s, scheduler_factory=factory, output=Output(None, out, err)) == 0
    lines = out.getvalue().splitlines()
    ends = [ln for ln in lines if " after " in ln]
    assert sorted(set(lines) - set(ends)) == [
        "[launcher] 1 server, 2 workers on 1 host; scheduler 127.0.0.1:45678",
        "[server 0] server done", "[worker 0] 45678 0 None", "[worker 1] 45678 1 None"]
    assert [ln.split(" exit 0 after ")[0].rstrip() for ln in ends] == [
        "[launcher] scheduler", "[launcher] server 0", "[launcher] worker 0", "[launcher] worker 1"], lines


def test_dry_run_starts_nothing():
    out = io.StringIO()

    def factory(env):
        raise AssertionError("dry run started the scheduler")
    assert run(spec("--dry-run", "python", "x.py"), scheduler_factory=factory, output=Output(None, out, out)) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "# 1 server, 2 workers on 1 host; scheduler 127.0.0.1:<port> (port chosen at start)"
    assert [ln.split("] ")[0] + "]" for ln in lines[1:]] == ["[server 0]", "[worker 0]", "[worker 1]"]


@pytest.mark.parametrize("limit, expected", [(0, 3), (1, 3), (2, 0)])
def test_restarts_start_a_failed_worker_again_up_to_the_limit(tmp_path, limit, expected):
    """A worker that fails twice, then succeeds: with 2 restarts the job ends 0; with fewer it
    ends with the worker's status, and the launcher's log says which limit ran out."""
    count = tmp_path / "count"
    code = (f"import os, sys; p = {str(count)!r}; n = int(open(p).read()) if os.path.exists(p) else 0; "
            "open(p, 'w').write(str(n + 1)); sys.exit(3 if n < 2 else 0)")
    job, out, err = make_job()
    job.spawn(Command("worker 0", py(code)))
    job.spawn(Command("server 0", py("import time; time.sleep(0.5)")))
    assert supervise(job, restarts=Restarts(limit)) == expected
    job.close()
    assert int(count.read_text()) == min(limit, 2) + 1
    assert len([p for p in job.procs if p.cmd.name == "worker 0"]) == min(limit, 2) + 1


def test_a_node_the_scheduler_declared_dead_is_stopped_but_never_its_restart(caplog):
    """Restarts.stop_unreachable: a process the scheduler gave up on (no heartbeat) is killed so
    it can be restarted; a process started after the dead node registered is its restart,
    which may take seconds to register (imports, ssh), and is left alone."""
    from ps.membership import Awaited

    class Sched:            # a SchedulerView: stop_unreachable reads only awaiting_restart
        declared: float | None = None
        done = ending = ended_well = False
        formed = True
        code = error = None

        def awaiting_restart(self):
            now = time.monotonic()
            return [] if self.declared is None else \
                [Awaited("worker", 1, now - self.declared, now - registered, "sent no heartbeat")]

        def closed_worker_ranks(self):
            return set()

        def close(self):
            pass

    job, out, err = make_job()
    old = job.spawn(Command("worker 1", py("import time; time.sleep(60)")))
    other = job.spawn(Command("worker 0", py("import time; time.sleep(60)")))
    sched, restarts = Sched(), Restarts(2)
    try:
        time.sleep(0.2)
        registered = time.monotonic()                  # worker 1 registers, later falls silent
        sched.declared = time.monotonic() - 0.5        # declared dead 0.5 s ago
        restarts.stop_unreachable(job, sched)
        assert old.poll() is None                      # within the grace: it may still exit by itself
        sched.declared = time.monotonic() - 5.0
        restarts.stop_unreachable(job, sched)
        assert poll_for(lambda: old.poll() is not None, 5), "the dead node's process was not stopped"
        assert id(old) in restarts.unreachable and other.poll() is None
        new = job.spawn(Command("worker 1", py("import time; time.sleep(60)")))  # its restart, registering
        time.sleep(0.2)
        sched.declared = time.monotonic()    # a death the scheduler sees only after the launcher restarted it
        time.sleep(0.3)
        restarts.stop_unreachable(job, sched, grace=0.1)
        time.sleep(0.3)
        assert new.poll() is None, "the restart was taken for the dead node"
        assert "worker 1 is dead to the scheduler (sent no heartbeat) but its process here (pid" in caplog.text
    finally:
        job.stop()
        job.close()


def test_the_scheduler_runner_gives_what_supervision_reads():
    """supervise() reads the scheduler only through SchedulerView; the runner the launcher
    hands it (launch.run) has every member of it, and reports a finished run through them."""
    class Finished:
        def run(self, timeout=None):
            return 0

        def close(self):
            pass
    runner = SchedulerRunner(Finished(), 0)
    runner.close()
    assert isinstance(runner, SchedulerView)
    assert runner.done and runner.ending and runner.ended_well and runner.code == 0 and runner.formed
    assert runner.closed_worker_ranks() == set() and runner.awaiting_restart() == []
    assert not isinstance(object(), SchedulerView)
