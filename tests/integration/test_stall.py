"""PS_STALL_WARNING: a worker that stops inside a sync round (or before a barrier) is
named by rank and host in the server's (the scheduler's) log and in the waiting worker's,
once, and the job still completes when it wakes up; a wait no server can name (a frozen
server) is named by the waiting workers themselves. Real processes, through the launcher."""
import re

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


SCRIPT = str(ROOT / "tests" / "integration" / "stall_worker.py")


def run(procs, mode, sleep, **env):
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            PYTHON, SCRIPT, mode, str(sleep)], cluster_env(0, **env))
    code, out, err = procs.finish(launcher, timeout=90)
    text = out + err
    assert code == 0, text
    assert sorted(re.findall(r"RESULT rank (\d) key3 \[2.0, 2.0, 2.0, 2.0\]", text)) == ["0", "1"], text
    return text.splitlines()


@pytest.mark.timeout(120)
def test_a_worker_asleep_in_a_round_is_named_by_the_server_and_the_waiting_worker(procs):
    lines = run(procs, "round", 6, PS_STALL_WARNING="2")
    server = [ln for ln in lines if ln.startswith("[server") and "has waited" in ln]
    assert len(server) == 1, lines           # keys 3 and 5 live on one server; once per stall
    assert "sync round 2 of keys 3, 5" in server[0] and "for worker 1 (W[11] on 127.0.0.1)" in server[0], server
    assert "worker 0 pushed and waits" in server[0]
    waiting = [ln for ln in lines if ln.startswith("[worker 0]") and "is waiting" in ln]
    assert len(waiting) == 1 and "for worker 1" in waiting[0] and "keys 3, 5" in waiting[0], lines
    assert not any(ln.startswith("[worker 1]") and "is waiting" in ln for ln in lines), lines
    assert any(ln.startswith("[server") and "went on" in ln for ln in lines), lines
    # the server named it: the waiting worker does not add a warning of its own
    assert not any("no complete reply" in ln for ln in lines), lines


@pytest.mark.timeout(120)
def test_a_request_begun_after_the_servers_notice_is_still_named_by_it(procs):
    """Worker 0 pulls 3 s into the stall, after the server's one notice: the stall is still
    named (until the server says it went on), so the worker adds no warning of its own. Before,
    it said at 4 s that no server had named anything."""
    lines = run(procs, "late", 9, PS_STALL_WARNING="2")
    server = [ln for ln in lines if ln.startswith("[server") and "has waited" in ln]
    assert len(server) == 1 and "for worker 1" in server[0], lines
    assert sum(ln.startswith("[worker 0]") and "is waiting" in ln for ln in lines) == 1, lines
    assert any(ln.startswith("[server") and "went on" in ln for ln in lines), lines
    assert not any("no complete reply" in ln for ln in lines), lines


@pytest.mark.timeout(120)
def test_a_frozen_server_is_named_by_the_workers_waiting_for_its_replies(procs):
    lines = run(procs, "server", 7, PS_STALL_WARNING="2", PS_HEARTBEAT_TIMEOUT="60")
    assert any(ln.startswith("[worker 0]") and "FREEZE server 1" in ln for ln in lines), lines
    for rank in (0, 1):         # each names its first unanswered request, once, and the server
        own = [ln for ln in lines if ln.startswith(f"[worker {rank}]") and "no complete reply" in ln]
        assert len(own) == 1, lines
        assert "from S[10]" in own[0] and "PS_STALL_WARNING=2s" in own[0] and "no server has named" in own[0], own
        assert re.search(r"(push|pull)\S* of key", own[0]), own
    # no round and no barrier lacked anyone. The thawed server names its own pause and reads the
    # pushes that waited in its socket before it judges (before, it named worker 0, in 4 runs of 8)
    assert not any("has waited" in ln for ln in lines), lines
    thawed = [ln for ln in lines if "periodic checks ran" in ln]
    assert len(thawed) == 1 and thawed[0].startswith("[server 1]") and re.search(r"ran [6-9]\.\ds late", thawed[0]), lines


@pytest.mark.timeout(120)
def test_a_worker_stopped_longer_than_the_request_timeout_reads_the_reply_that_came_meanwhile(procs):
    """Worker 0 is SIGSTOPped for 6 s while it waits for a pull; the reply comes a second after
    it resumes. With PS_REQUEST_TIMEOUT=4 it waited 7.5 s, but ran only 1.5 s of them: the
    pause is not counted. Before, it failed on resuming with "no complete reply ... within 4s"."""
    lines = run(procs, "self", 6, PS_REQUEST_TIMEOUT="4", PS_HEARTBEAT_TIMEOUT="30")
    assert any(ln.startswith("[worker 0]") and "FREEZE worker 0" in ln for ln in lines), lines
    paused = [ln for ln in lines if ln.startswith("[worker 0]") and "periodic checks ran" in ln]
    assert len(paused) == 1 and re.search(r"ran [5-9]\.\ds late", paused[0]), lines
    assert not any("PS_REQUEST_TIMEOUT" in ln for ln in lines), lines


@pytest.mark.timeout(120)
def test_a_worker_late_for_a_barrier_is_named_by_the_scheduler_and_the_waiting_worker(procs):
    lines = run(procs, "barrier", 6, PS_STALL_WARNING="2")
    sched = [ln for ln in lines if ln.startswith("[scheduler]") and "has waited" in ln]
    assert len(sched) == 1 and "barrier 'workers'" in sched[0] and "for worker 1 (W[11] at 127.0.0.1:" in sched[0], lines
    waiting = [ln for ln in lines if ln.startswith("[worker 0]") and "is waiting" in ln]
    assert len(waiting) == 1 and "worker 1" in waiting[0], lines


@pytest.mark.timeout(120)
def test_zero_turns_the_warning_off(procs):
    lines = run(procs, "round", 3, PS_STALL_WARNING="0")
    assert not any("has waited" in ln or "is waiting" in ln for ln in lines), lines
