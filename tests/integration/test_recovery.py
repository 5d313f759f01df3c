"""--max-restarts: a server SIGKILLed mid-job is started again by the launcher, recovers its
keys and optimizer state from its replica on another server, and the job ends with exactly
the weights of a run nobody killed; a killed worker is started again, rejoins with its rank
and the job ends with the same weights too. Real processes through the launcher, real SIGKILL."""
import contextlib
import random
import re
import subprocess

import numpy as np
import psutil
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env, once_per_session, read_until

pytestmark = pytest.mark.process


SCRIPT = str(ROOT / "tests" / "integration" / "recovery_worker.py")
ROUNDS = 40


def start(procs, out, optimizer, *kills, rounds=ROUNDS, restarts=2, servers=2, workers=2, extra=(), merged=False,
          **env):
    """The launcher of a job; ``kills``: (server rank, round, when) or (role, rank, round, when);
    ``merged``: its stderr (the scheduler's log) comes on stdout."""
    layout = ["--mode", "mpi"] if servers == "joint" else ["-s", str(servers)]
    args = [PYTHON, "-m", "ps.launch", "-n", str(workers), *layout, "--launcher", "local",
            "--max-restarts", str(restarts), PYTHON, SCRIPT, str(out), str(rounds), optimizer, *extra]
    for kill in kills:
        role, rank, rnd, when = kill if len(kill) == 4 else ("server", *kill)
        args += ["--kill", role, str(rank), str(rnd), when]
    env = cluster_env(0, MXNET_KVSTORE_BIGARRAY_BOUND="100000", **env)   # key 5 cut across both servers
    return procs.start(args, env, **({"stderr": subprocess.STDOUT} if merged else {}))


def launch(procs, out, optimizer, *kills, timeout=150, **kw):
    code, stdout, stderr = procs.finish(start(procs, out, optimizer, *kills, **kw), timeout=timeout)
    return code, stdout + stderr


def weights(path):
    with np.load(path / "weights.npz") as f:
        return {k: f[k] for k in f}


def job_processes(text):
    """Processes still alive that belong to the job (its scheduler port in their environment)."""
    port = re.search(r"scheduler 127\.0\.0\.1:(\d+)", text).group(1)
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DMLC_PS_ROOT_PORT") == port:
                left.append(proc)
        except (psutil.Error, OSError):
            continue
    return left


def reference_runs(tmp_path_factory, group, runs):
    """The weights of jobs nobody killed, run once per session (tests on every xdist worker
    compare with them): ``runs(directory)`` maps a name to (optimizer, extra arguments)."""
    from tests.helpers import Procs

    def make(root):
        procs = Procs()
        try:
            for name, (optimizer, extra) in runs(root).items():
                (root / name).mkdir()
                code, text = launch(procs, root / name, optimizer, restarts=0, extra=extra)
                assert code == 0, text
        finally:
            procs.cleanup()
    root = once_per_session(tmp_path_factory, group, make)
    return {name: weights(root / name) for name in runs(root)}


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory):
    """The reference weights: the same job, nobody killed (one run per optimizer)."""
    return reference_runs(tmp_path_factory, "recovery", lambda root: {opt: (opt, ()) for opt in ("sgd", "adam", "none")})


@pytest.mark.timeout(200)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_killed_server_recovers_and_nothing_is_lost(procs, tmp_path, unfaulted, optimizer):
    rng = random.Random()
    kill = (rng.randrange(2), rng.randrange(5, ROUNDS - 5), rng.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, optimizer, kill)
    assert code == 0, f"kill {kill}\n{text}"
    assert f"KILL server {kill[0]}" in text and "starting it again (restart 1 of 2)" in text, text
    assert re.search(rf"server {kill[0]} \(S\[\d+\]\) recovered \d+ keys", text), text
    assert "DONE rank 0" in text and "DONE rank 1" in text, text
    got = weights(tmp_path)
    for key, ref in unfaulted[optimizer].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, f"key {key}, kill {kill}"   # measured: 0.0 (bit-identical)
    assert not job_processes(text)


@pytest.mark.timeout(200)
def test_a_killed_joint_process_comes_back_with_its_shard_on_one_restart(procs, tmp_path, unfaulted):
    """--mode mpi: worker 1 holds server 1's shard in its process; killed, the launcher starts
    it once (--max-restarts 1 is enough: the limit counts processes), its shard comes back from
    the replica, and the weights are those of the unfaulted job with separate servers."""
    code, text = launch(procs, tmp_path, "sgd", ("joint", 1, 20, "push"), servers="joint", restarts=1)
    assert code == 0, text
    assert "KILL joint 1" in text and "starting it again (restart 1 of 1)" in text, text
    assert re.search(r"server 1 \(S\[\d+\]\) recovered \d+ keys", text), text
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.array_equal(got[key], ref), f"key {key}"
    assert not job_processes(text)


@pytest.mark.timeout(200)
def test_both_servers_killed_one_after_the_other(procs, tmp_path, unfaulted):
    code, text = launch(procs, tmp_path, "sgd", (0, 10, "push"), (1, 30, "pull"))
    assert code == 0, text
    assert "restart 2 of 2" in text, text
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, key


@pytest.mark.timeout(200)
def test_lost_messages_and_a_killed_server_still_exact(procs, tmp_path, unfaulted):
    kill = (random.randrange(2), random.randrange(5, 25), random.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, "sgd", kill, PS_RESEND="1", PS_DROP_MSG="10", PS_RESEND_TIMEOUT="40")
    assert code == 0, f"kill {kill}\n{text}"
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, f"key {key}, kill {kill}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_kill_with_the_send_window_over_tcp_still_exact(procs, tmp_path, unfaulted, role):
    """PS_SEND_WINDOW smaller than one message of key 5, over TCP (PS_LOCAL_IPC=0: the window
    is for network links): the dead node's unanswered bytes stop counting, and nothing the
    window held back is lost or sent twice."""
    kill = (role, 1, random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, "sgd", kill, PS_LOCAL_IPC="0", PS_SEND_WINDOW="256K")
    assert code == 0, f"kill {kill}\n{text}"
    assert f"{role} 1 was killed by SIGKILL: starting it again (restart 1 of 2)" in text, text
    assert_unfaulted(tmp_path, unfaulted["sgd"], f"kill {kill}")


@pytest.mark.timeout(120)
def test_kills_beyond_the_limit_end_the_job_naming_the_node_and_the_limit(procs, tmp_path):
    code, text = launch(procs, tmp_path, "sgd", (1, 5, "push"), (1, 15, "push"), restarts=1, rounds=30)
    assert code != 0, text
    assert "server 1 was killed by SIGKILL; the job has used all of its 1 restart(s) (--max-restarts)" in text, text
    assert not (tmp_path / "weights.npz").exists()
    assert not job_processes(text), text


@pytest.mark.timeout(120)
def test_one_server_has_no_replica_so_its_death_ends_the_job(procs, tmp_path):
    code, text = launch(procs, tmp_path, "sgd", (0, 5, "push"), servers=1, workers=1, rounds=20)
    assert code != 0, text
    assert "with one server there is no replica of its state to recover from" in text, text
    assert not job_processes(text), text


def assert_all_workers_equal(path, workers=2):
    ranks = [weights_of(path / f"weights-rank{r}.npz") for r in range(workers)]
    for other in ranks[1:]:
        for key, value in ranks[0].items():
            np.testing.assert_array_equal(other[key], value)


def assert_unfaulted(path, ref, what="", workers=2):
    """Every worker ends with the same weights, those of the run nobody killed (measured:
    bit-identical; 1e-6 leaves room for nothing but float printing)."""
    assert_all_workers_equal(path, workers)
    got = weights(path)
    for key, want in ref.items():
        assert np.abs(got[key] - want).max() <= 1e-6, f"key {key} {what}"


def weights_of(file):
    with np.load(file) as f:
        return {k: f[k] for k in f}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["replay", "resume", "resume-sums"])
def test_a_killed_worker_rejoins_with_its_rank_and_nothing_is_lost(procs, tmp_path, unfaulted, mode):
    """``resume-sums``: no optimizer, so the servers hold each round's sum; the restart jumps
    to kv.round and pulls every key first (refused before: a sum is not weights)."""
    optimizer = {"replay": "sgd", "resume": "adam", "resume-sums": "none"}[mode]
    kill = ("worker", 1, random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, optimizer, kill, extra=["--resume"] if mode != "replay" else [])
    assert code == 0, f"kill {kill}\n{text}"
    assert "worker 1 was killed by SIGKILL: starting it again (restart 1 of 2)" in text, text
    restarted = re.search(r"RESTARTED rank 1 round (\d+)", text)
    # the round it learned: its dead self may have pushed a step ahead of worker 0 (which killed it)
    assert restarted and kill[2] <= int(restarted.group(1)) <= kill[2] + 2, text
    if mode != "replay":
        assert f"RESUMED rank 1 at round {restarted.group(1)}: pulled every key" in text, text
    assert "worker 1 (W[11]) is back (restart 1)" in text, text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted[optimizer].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, f"key {key}, kill {kill}"     # measured: 0.0
    assert not job_processes(text)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("victim", ["server", "worker"])
def test_a_node_killed_before_the_cluster_forms_is_replaced_by_the_launchers_restart(procs, tmp_path, unfaulted,
                                                                                     victim):
    """Worker 0 holds formation back, and kills server 1 (worker 1) after it registered: the
    launcher starts it again, the restart takes the dead node's place, and the job trains as
    if nothing happened. Before, the restart was refused as one node too many."""
    code, text = launch(procs, tmp_path, "sgd", extra=["--kill-before-formation", victim, "1"])
    assert code == 0, text
    assert f"KILL {victim} 1" in text and f"{victim} 1 was killed by SIGKILL: starting it again" in text, text
    assert re.search(rf"the {victim} that registered from \S+ (closed its connection|could not be reached)", text) \
        or "did not come back within" in text, text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, key
    assert not job_processes(text)


@pytest.mark.timeout(200)
def test_worker_0_killed_between_init_and_set_optimizer_still_trains_exactly(procs, tmp_path, unfaulted):
    """Its restart re-runs the script: its replayed init changes nothing, but its
    set_optimizer must be applied, since its dead self never sent one. Before, the servers
    ignored it as a replay and stored gradient sums as weights (off by 1.02, exit 0)."""
    code, text = launch(procs, tmp_path, "sgd", extra=["--die-after-init"])
    assert code == 0, text
    assert "KILL worker 0 itself after init" in text and "RESTARTED rank 0 round 0" in text, text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, key


@pytest.fixture(scope="module")
def unfaulted_lr(tmp_path_factory):
    """The weights of the job nobody killed that changes its learning rate at round 20 (run
    once per session, apart from ``unfaulted``'s group so that neither waits for the other)."""
    return reference_runs(tmp_path_factory, "recovery-lr", lambda root: {"lr": ("sgd", ["--lr-at", "20"])})["lr"]


@pytest.mark.timeout(200)
def test_worker_0_killed_before_a_learning_rate_change_still_trains_exactly(procs, tmp_path, unfaulted_lr):
    """The restart replays the script from round 0 and sends the change its dead self never
    sent; the servers must apply it (before, any setting from a replaying worker was ignored
    once the store had an optimizer, and training went on at the old rate)."""
    code, text = launch(procs, tmp_path, "sgd", extra=["--lr-at", "20", "--die-before-lr"])
    assert code == 0, text
    assert "KILL worker 0 itself before set_params at round 20" in text and "RESTARTED rank 0" in text, text
    assert_unfaulted(tmp_path, unfaulted_lr)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("server", [0, 1])
def test_a_server_dying_with_worker_0_just_before_a_learning_rate_change_still_trains_exactly(procs, tmp_path,
                                                                                            server, unfaulted_lr):
    """A machine dies: a server, then (50 ms later) worker 0, just before it sends a new learning
    rate. The server's restart must apply that set_params when worker 0's restart sends it: its
    dead self never made it. Before, the restart had lost its dead self's per-worker counts of
    settings, took the set_params for a replay, ignored it, and its keys trained on at the old
    rate (exit 0, weights off by 0.196 in 4 of 4 hand runs)."""
    code, text = launch(procs, tmp_path, "sgd", ("server", server, 19, "pull"), restarts=3,
                        extra=["--lr-at", "20", "--die-before-lr"])
    assert code == 0, text
    assert "KILL worker 0 itself before set_params at round 20" in text, text
    assert re.search(rf"server {server} \(S\[\d+\]\) recovered \d+ keys", text), text
    assert_unfaulted(tmp_path, unfaulted_lr)


@pytest.mark.timeout(200)
def test_a_worker_and_then_a_server_killed_in_one_job(procs, tmp_path, unfaulted):
    code, text = launch(procs, tmp_path, "sgd", ("worker", 1, 12, "push"), ("server", 1, 30, "pull"))
    assert code == 0, text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, key


@pytest.mark.timeout(200)
@pytest.mark.parametrize("optimizer, rank", [("sgd", 1), ("adam", 0)])
def test_a_server_and_a_worker_killed_at_once_lose_nothing(procs, tmp_path, unfaulted, optimizer, rank):
    """A machine that dies takes its server and its worker with it (the usual placement: one
    of each per host). Before, the second death ended the job: "one failure at a time". Rank 0
    (it kills itself with server 0) sends the job's settings: a server restart that did not
    know its worker had died applied the replayed set_optimizer over the recovered Adam state
    (exit 0, weights off by 0.09 in 2 of 6 hand runs)."""
    rnd, when = random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"])
    code, text = launch(procs, tmp_path, optimizer, ("server", rank, rnd, when), ("worker", rank, rnd, when),
                        restarts=2)
    assert code == 0, f"round {rnd} {when}\n{text}"
    assert f"server {rank} was killed by SIGKILL: starting it again" in text, text
    assert f"worker {rank} was killed by SIGKILL: starting it again" in text, text
    assert re.search(rf"server {rank} \(S\[\d+\]\) recovered \d+ keys", text), text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted[optimizer].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, f"key {key}, round {rnd} {when}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_hung_node_is_stopped_and_started_again_once_the_scheduler_declares_it_dead(procs, tmp_path, unfaulted,
                                                                                       role):
    """SIGSTOP: the process lives, its connections stay open, only its heartbeats stop. The
    scheduler declares it dead after PS_HEARTBEAT_TIMEOUT and gives its place to a restart;
    the launcher then stops it and starts it again. Before, nothing stopped it: the job waited
    for a restart until PS_CONNECT_TIMEOUT, then failed."""
    rnd = random.randrange(5, ROUNDS - 5)
    code, text = launch(procs, tmp_path, "sgd", (role, 1, rnd, "push"), extra=["--freeze"],
                        PS_HEARTBEAT_INTERVAL="0.5", PS_HEARTBEAT_TIMEOUT="3")
    assert code == 0, f"round {rnd}\n{text}"
    assert re.search(rf"{role} 1 is dead to the scheduler \(.*sent no heartbeat.*\) but its process here "
                     r"\(pid \d+\) still runs: stopping it", text), text
    assert f"{role} 1 was unreachable: starting it again (restart 1 of 2)" in text, text
    assert_all_workers_equal(tmp_path)
    got = weights(tmp_path)
    for key, ref in unfaulted["sgd"].items():
        assert np.abs(got[key] - ref).max() <= 1e-6, f"key {key}, round {rnd}"
    assert not job_processes(text), text


@pytest.mark.timeout(200)
@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_restart_killed_while_it_recovers_is_started_again_and_nothing_is_lost(procs, tmp_path, unfaulted, role):
    """The restart of a killed node is SIGKILLed too, the moment the scheduler admits it (while
    it fetches its state or asks how far it got). Before, the scheduler never noticed a restart
    die before it was back: the next restart was refused ("no server is awaiting its restart")
    and the job ended; and a backup that had handed its replica over kept none for the next one."""
    job = start(procs, tmp_path, "adam", (role, 1, random.randrange(5, ROUNDS - 5), "push"), merged=True)
    tag = f"as the restart of {'S' if role == 'server' else 'W'}["
    read_until(job, lambda line: tag in line, 60, f"the scheduler admitting the {role}'s restart")
    found = []
    for proc in psutil.Process(job.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("DMLC_ROLE") == role and env.get("DMLC_RANK") == "1" and proc.name().startswith("python"):
                found.append(proc)
    assert found, f"no {role} 1 process"
    max(found, key=lambda p: p.create_time()).kill()
    code, out, err = procs.finish(job, timeout=150)
    text = out + err
    assert code == 0, text
    assert f"{role} 1 was killed by SIGKILL: starting it again (restart 2 of 2)" in text, text
    assert_unfaulted(tmp_path, unfaulted["adam"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("optimizer, servers, worker", [("adam", (0, 2), 0), ("sgd", (1, 3), 2)])
def test_servers_that_are_not_ring_neighbours_recover_together(procs, tmp_path, optimizer, servers, worker):
    """A machine running two servers (4 servers, dmlc placement on 2 hosts: ranks 0 and 2 on one)
    dies with both and a worker. Each server's only copy is on the next one in the ring, so
    two servers further apart recover together. Before, the second server's death ended the
    job ("one server at a time")."""
    (tmp_path / "ref").mkdir()
    code, text = launch(procs, tmp_path / "ref", optimizer, restarts=0, servers=4, workers=3)
    assert code == 0, text
    rnd, when = random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"])
    kills = [("server", s, rnd, when) for s in servers] + [("worker", worker, rnd, when)]
    code, text = launch(procs, tmp_path, optimizer, *kills, restarts=3, servers=4, workers=3)
    assert code == 0, f"round {rnd} {when}\n{text}"
    for s in servers:
        assert re.search(rf"server {s} \(S\[\d+\]\) recovered \d+ keys", text), text
    assert f"worker {worker} was killed by SIGKILL: starting it again" in text, text
    assert_unfaulted(tmp_path, weights(tmp_path / "ref"), f"round {rnd} {when}", workers=3)


@pytest.mark.timeout(120)
def test_both_servers_killed_at_once_end_the_job_naming_both(procs, tmp_path):
    """Each server holds the other's only replica: two at once cannot be recovered."""
    code, text = launch(procs, tmp_path, "sgd", ("server", 0, 5, "push"), ("server", 1, 5, "push"), rounds=20)
    assert code != 0, text
    assert re.search(r"it failed while server \d \(S\[\d+\].*\), its neighbour in the replica ring, was still "
                     r"recovering: each server keeps the only copy of the one before it", text), text
    assert not (tmp_path / "weights.npz").exists()
    assert not job_processes(text), text


@pytest.mark.timeout(120)
def test_the_restart_aware_example_resumes_where_it_died(procs):
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            "--max-restarts", "1", PYTHON, "examples/restart_train.py", "--crash-at", "30"],
                           cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=100)
    text = out + err
    assert code == 0, text
    assert "worker 1 crashes at step 30" in text and "worker 1 restarted: resuming at step 30" in text, text
    finals = re.findall(r"worker (\d): final loss ([0-9.]+), w\[:3\] (.*)", text)
    assert sorted(f[0] for f in finals) == ["0", "1"] and finals[0][1:] == finals[1][1:], text
    assert float(finals[0][1]) < 0.01, text          # it learned: w ~ linspace(-1, 1)


@pytest.mark.timeout(200)
def test_in_dist_async_a_killed_worker_rejoins_and_the_others_go_on(procs, tmp_path):
    kill = ("worker", 1, 15, "push")
    code, text = launch(procs, tmp_path, "sgd", kill, rounds=40, extra=["--type", "dist_async"])
    assert code == 0, text
    assert "worker 1 was killed by SIGKILL: starting it again" in text and "RESTARTED rank 1" in text, text
    assert_all_workers_equal(tmp_path)          # the final pulls, after the last barrier
    assert not job_processes(text)


@pytest.mark.timeout(120)
def test_a_dead_server_nobody_restarts_ends_the_job_after_the_connect_timeout(procs, port, tmp_path):
    """By hand (no launcher to restart it): the job waits PS_CONNECT_TIMEOUT for the restart,
    then ends, naming the server and the wait."""
    env = cluster_env(port, PS_MAX_RESTARTS="1", PS_CONNECT_TIMEOUT="8", MXNET_KVSTORE_BIGARRAY_BOUND="100000")
    sched = procs.role("scheduler", env)
    servers = [procs.role("server", {**env, "DMLC_RANK": str(r)}) for r in range(2)]
    workers = [procs.role("worker", {**env, "DMLC_RANK": str(r)}, SCRIPT, str(tmp_path), "200", "sgd",
                          *(["--kill", "server", "1", "5", "push"] if r == 0 else [])) for r in range(2)]
    code, out, err = procs.finish(workers[0], timeout=60)
    assert code != 0, out + err
    assert "KILL server 1" in out, out + err
    assert re.search(r"server 1 \(S\[10\] at [\d.:]+\) closed its connection and did not come back within 2s "
                     r"\(process died\?\); it was not restarted within 8s \(PS_CONNECT_TIMEOUT\)", err), err
    for proc in [sched, servers[0], workers[1]]:
        assert procs.finish(proc, timeout=30)[0] != 0


@pytest.mark.timeout(120)
def test_a_restarted_server_knows_which_workers_closed_their_stores(procs, tmp_path):
    """Workers with different numbers of steps (MXNet #7888) and a server restart: worker 1
    closes after 2 steps, server 1 is SIGKILLed, worker 0's third push reaches its restart,
    which fails it naming worker 1 as its dead self would have (before: it waited for ever)."""
    script = str(ROOT / "tests" / "integration" / "closed_worker.py")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", "--max-restarts",
                            "1", PYTHON, script, str(tmp_path / "closed")], cluster_env(0, PS_STALL_WARNING="10"))
    code, out, err = procs.finish(launcher, timeout=90)
    text = out + err
    assert "KILLED server 1" in text and "server 1 was killed by SIGKILL: starting it again" in text, text
    assert text.count("STEP ") == 4 and "STEP 1 [2.0, 2.0, 2.0, 2.0]" in text, text
    refused = [ln for ln in text.splitlines() if "REFUSED step 2" in ln]
    assert len(refused) == 1 and refused[0].startswith("[worker 0]"), text
    assert "worker 1 (W[11]) closed its store without pushing" in refused[0], refused
    assert code == 0, text


# -- embedding tables (ps.embed) under --max-restarts ------------------------------------------
@pytest.fixture(scope="module")
def unfaulted_tables(tmp_path_factory):
    """Reference weights and table rows of the --table jobs, nobody killed ("loaded": sync, the
    table loaded from a checkpoint by rank 0 first)."""
    def runs(root):
        loaded = ["--table", "sync", "--table-load", str(root / "ckpt"), "--table-save", "4", str(root / "saved")]
        return {**{mode: ("sgd", ["--table", mode]) for mode in ("sync", "async")}, "loaded": ("sgd", loaded)}
    return reference_runs(tmp_path_factory, "recovery-tables", runs)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_server_gives_back_its_embedding_rows_and_nothing_is_lost(procs, tmp_path, unfaulted_tables, mode):
    """Sync: every row and the dense keys bit-identical to the run nobody killed. Async: the
    two workers' pushes interleave differently in any two runs, so SGD's rows agree to float
    rounding only; a lost or twice-applied push (0.1 x a gradient row) would be far off."""
    kill = (random.randrange(2), random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, "sgd", kill, extra=["--table", mode])
    assert code == 0, f"kill {kill}\n{text}"
    assert re.search(rf"server {kill[0]} \(S\[\d+\]\) recovered \d+ keys \([\d.]+ MB\) and 1 embedding tables "
                     r"\(\d+ rows\)", text), text
    assert_all_workers_equal(tmp_path)
    got, ref = weights(tmp_path), unfaulted_tables[mode]
    assert got.keys() == ref.keys() and "table" in got
    for key, want in ref.items():
        tol = 1e-6 if mode == "sync" or key != "table" else 1e-5
        assert np.abs(got[key] - want).max() <= tol, f"key {key}, kill {kill}"
    assert not job_processes(text)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("resume", [False, True])
def test_a_killed_worker_rejoins_an_embedding_table_and_nothing_is_lost(procs, tmp_path, unfaulted_tables, resume):
    kill = ("worker", 1, random.randrange(5, ROUNDS - 5), random.choice(["push", "pull"]))
    code, text = launch(procs, tmp_path, "sgd", kill, extra=["--table", "sync", *(["--resume"] if resume else [])])
    assert code == 0, f"kill {kill}\n{text}"
    assert "worker 1 (W[11]) is back (restart 1)" in text, text
    assert_unfaulted(tmp_path, unfaulted_tables["sync"], f"kill {kill}")


@pytest.mark.timeout(200)
def test_a_restarted_worker_that_loads_a_checkpoint_again_does_not_put_it_over_the_trained_rows(procs, tmp_path,
                                                                                                unfaulted_tables):
    """Rank 0 loads the table from a checkpoint before round 0, saves it at round 4, and is
    SIGKILLed later; its restart re-runs the script, load and save included. The servers count
    its table_puts as they count a replayed set_optimizer: those its dead self made are not
    applied again; the save its dead self made is not made again. Before, the restart put the
    checkpoint's rows over the rows trained since, and the job ended without error on other rows
    than the run nobody killed; and its save stopped on the directory its dead self wrote."""
    kill = ("worker", 0, random.randrange(6, ROUNDS - 5), random.choice(["push", "pull"]))
    extra = ["--table", "sync", "--table-load", str(tmp_path / "ckpt"), "--table-save", "4", str(tmp_path / "saved")]
    code, text = launch(procs, tmp_path, "sgd", kill, extra=extra)
    assert code == 0, f"kill {kill}\n{text}"
    assert "worker 0 (W[9]) is back (restart 1)" in text and text.count("LOADED ") == 2, text
    assert text.count("SAVED ") == 2 and "holds the save of table 'emb' this worker's dead self made" in text, text
    assert_unfaulted(tmp_path, unfaulted_tables["loaded"], f"kill {kill}")
