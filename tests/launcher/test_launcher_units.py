"""Pure parts of the launcher: CLI parsing, hostfiles, placement, env dicts, command building.
Backends are compared as argv lists (style R27)."""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import replace

import pytest

from launcher import local, mpi, sge, slurm, ssh, tracker, yarn
from launcher.hosts import Host, HostfileError, parse_hostfile, place
from launcher.launch import parse_args, render
from launcher.output import EXIT_MARKER, IdCatcher
from launcher.process import Command
from launcher.spec import SpecError, parse_env_pair

PY = "/opt/py/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "OMP_NUM_THREADS": "4", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
       "PS_VERBOSE": "1", "PS_SECRET_FILE": "/etc/ps/secret", "PORT": "9000", "DMLC_ROLE": "worker",
       "MXNET_ENGINE_TYPE": "NaiveEngine", "PYTHONPATH": "/src"}


def spec_of(*argv: str, environ=ENV, hostfile_text: str | None = None, tmp_path=None):
    args = list(argv)
    if hostfile_text is not None:
        path = tmp_path / "hosts"
        path.write_text(hostfile_text)
        args = ["-H", str(path)] + args
    from dataclasses import replace
    return replace(parse_args(args, environ, python=PY), cwd="/work/job")


JOB = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "10.0.0.1",
       "DMLC_PS_ROOT_PORT": "9091", "DMLC_JOB_CLUSTER": "x", "PYTHONUNBUFFERED": "1"}


# --- CLI -----------------------------------------------------------------------------

def test_cli_defaults_and_command_kept_verbatim():
    spec = spec_of("-n", "2", "python3", "train.py", "--lr", "0.1", "-n", "5", "--env", "X:1")
    assert (spec.num_workers, spec.num_servers, spec.launcher) == (2, 2, "local")
    assert spec.command == ("python3", "train.py", "--lr", "0.1", "-n", "5", "--env", "X:1")
    assert spec.server_command == ("python3", "-m", "ps")  # the worker's interpreter
    assert spec_of("-n", "1", "./run.sh").server_command == (PY, "-m", "ps")
    assert spec_of("-n", "1", "--", "-weird").command == ("-weird",)


def test_cli_unknown_options_before_the_command_are_appended_in_order():
    spec = spec_of("-n", "1", "--kv-store-flag", "-s", "1", "--other", "python", "x.py", "a")
    assert spec.command == ("python", "x.py", "a", "--kv-store-flag", "--other")


def test_cli_env_options():
    spec = spec_of("-n", "1", "--env", "A:1", "--env", "B=x:y", "--env", "C:a b:c", "--env", "OMP_NUM_THREADS",
                   "--env-server", "S:2", "--env-worker", "W:3", "--env-worker", "A:w", "python", "x.py")
    assert spec.user_env("server") == {"A": "1", "B": "x:y", "C": "a b:c", "OMP_NUM_THREADS": "4", "S": "2"}
    assert spec.user_env("worker") == {"A": "w", "B": "x:y", "C": "a b:c", "OMP_NUM_THREADS": "4", "W": "3"}


@pytest.mark.parametrize("argv, message", [
    (["-n", "0", "x"], "-n/--num-workers must be >= 1, got 0"),
    (["-n", "1", "-s", "0", "x"], "-s/--num-servers must be >= 1, got 0"),
    (["-n", "1"], "no command given"),
    (["-n", "1", "--launcher", "ssh", "x"], "--launcher ssh needs -H/--hostfile"),
    (["-n", "1", "--sync-dst-dir", "/d", "x"], "--sync-dst-dir only works with --launcher ssh"),
    (["-n", "1", "--env", "1BAD", "x"], "--env expects NAME:VALUE (e.g. OMP_NUM_THREADS:4), got '1BAD'"),
    (["-n", "1", "--env", "NOPE", "x"], "--env NOPE: no value given and NOPE is not set"),
    (["-n", "1", "--env-worker", "DMLC_ROLE:server", "x"], "--env-worker DMLC_ROLE: the launcher sets"),
    (["-n", "1", "--timeout", "0", "x"], "--timeout must be > 0 seconds, got 0.0"),
    (["-n", "1", "--max-restarts", "-1", "x"], "--max-restarts must be >= 0, got -1"),
    (["-n", "1", "--launcher", "slurm", "--max-restarts", "2", "x"],
     "--max-restarts needs a launcher that starts each process itself (local or ssh); --launcher slurm"),
    (["-n", "2", "-s", "2", "--mode", "mpi", "x"], "-s 2 with --mode mpi: in mpi mode every worker holds one server"),
    (["-n", "2", "--mode", "mpi", "--launcher", "slurm", "--slurm-server-nodes", "1", "x"],
     "--slurm-server-nodes with --mode mpi: there are no server processes"),
])
def test_cli_errors_name_the_option(argv, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_of(*argv)


def test_cli_hostfile_launcher_rules(tmp_path):
    spec = spec_of("-n", "1", "x", hostfile_text="h1\n", tmp_path=tmp_path)
    assert spec.launcher == "ssh" and spec.hosts == (Host("h1"),)
    with pytest.raises(SpecError, match="-H/--hostfile is for --launcher ssh or mpi, not local"):
        spec_of("--launcher", "local", "-n", "1", "x", hostfile_text="h1\n", tmp_path=tmp_path)


def test_max_restarts_reaches_every_process_and_the_scheduler():
    from launcher.tracker import job_env, scheduler_env
    spec = spec_of("-n", "2", "--max-restarts", "3", "python", "x.py")
    assert spec.max_restarts == 3
    assert job_env(spec, "127.0.0.1", 9000)["PS_MAX_RESTARTS"] == "3"
    assert scheduler_env(spec, "127.0.0.1", {})["PS_MAX_RESTARTS"] == "3"
    assert "PS_MAX_RESTARTS" not in job_env(spec_of("-n", "2", "python", "x.py"), "127.0.0.1", 9000)


def test_parse_env_pair():
    assert parse_env_pair("LD_LIBRARY_PATH:/a:/b", {}) == ("LD_LIBRARY_PATH", "/a:/b")
    assert parse_env_pair("X=", {}) == ("X", "")
    assert parse_env_pair("HOME", {"HOME": "/h"}) == ("HOME", "/h")


# --- hostfile and placement ---------------------------------------------------------------

def test_hostfile_formats():
    text = "\n# comment\n10.0.0.1\n10.0.0.2:2222  # ssh port\nnode3 slots=4\nnode4:22 slots=2\n\n"
    assert parse_hostfile(text) == [Host("10.0.0.1"), Host("10.0.0.2", 2222), Host("node3", None, 4),
                                    Host("node4", 22, 2)]
    for bad in ("h:notaport", "h:70000", "h slots=0", "h foo", ":22"):
        with pytest.raises(HostfileError):
            parse_hostfile(bad)
    with pytest.raises(HostfileError, match="no hosts"):
        parse_hostfile("# nothing\n")


def test_placement_servers_first_round_robin():
    hosts = [Host(f"h{i}") for i in range(1, 6)]
    tasks = place(3, 3, hosts)  # dmlc: servers on hosts 1-3, workers on 4, 5, 1
    assert [(t.role, t.rank, t.task_id, t.host.name) for t in tasks] == [
        ("server", 0, 0, "h1"), ("server", 1, 1, "h2"), ("server", 2, 2, "h3"),
        ("worker", 0, 3, "h4"), ("worker", 1, 4, "h5"), ("worker", 2, 5, "h1")]


def test_role_marks_put_servers_on_their_own_hosts():
    hosts = parse_hostfile("w1\nw2 role=worker\ns1 role=server\ns2:2222 role=server slots=8\n")
    assert hosts[3] == Host("s2", 2222, 8, "server")
    tasks = place(3, 4, hosts)      # servers round robin on s1, s2; workers on w1, w2
    assert [(t.role, t.rank, t.task_id, t.host.name) for t in tasks] == [
        ("server", 0, 0, "s1"), ("server", 1, 1, "s2"), ("server", 2, 2, "s1"),
        ("worker", 0, 3, "w1"), ("worker", 1, 4, "w2"), ("worker", 2, 5, "w1"), ("worker", 3, 6, "w2")]
    # only workers marked: the unmarked hosts take the servers and workers too
    tasks = place(2, 2, parse_hostfile("a role=worker\nb\n"))
    assert [(t.role, t.host.name) for t in tasks] == [("server", "b"), ("server", "b"), ("worker", "a"),
                                                      ("worker", "b")]
    with pytest.raises(HostfileError, match="role must be server or worker"):
        parse_hostfile("h role=scheduler")


def test_server_hosts_option(tmp_path):
    (tmp_path / "servers").write_text("s1\ns2\n")
    spec = spec_of("-n", "2", "--server-hosts", str(tmp_path / "servers"), "x", hostfile_text="w1\nw2\n",
                   tmp_path=tmp_path)
    assert spec.num_servers == 2 and spec.hosts[2:] == (Host("s1", role="server"), Host("s2", role="server"))
    cmds = {c.name: c.host for c in ssh.build_commands(spec, JOB, {})}
    assert cmds == {"server 0": "s1", "server 1": "s2", "worker 0": "w1", "worker 1": "w2"}
    assert ssh.host_count(spec) == 4
    mpi_argv = mpi.build_commands(replace(spec, launcher="mpi"), JOB, {}, {}, "openmpi", False)
    assert [c.argv[c.argv.index("-H") + 1] for c in mpi_argv] == ["s1:1,s2:1", "w1:1,w2:1"]
    (tmp_path / "bad").write_text("s1 role=worker\n")
    for argv, message in [
            (["--server-hosts", str(tmp_path / "servers"), "-n", "1", "x"], "needs -H/--hostfile: the workers' hosts"),
            (["-H", str(tmp_path / "servers"), "--server-hosts", str(tmp_path / "bad"), "-n", "1", "x"],
             "s1 is marked role=worker"),
            (["-H", str(tmp_path / "servers"), "--server-hosts", str(tmp_path / "servers"), "--mode", "mpi",
              "-n", "1", "x"], "with --mode mpi: there are no server processes")]:
        with pytest.raises(SpecError, match=message):
            spec_of(*argv)
    with pytest.raises(HostfileError, match="every host is marked role=server: no host for the workers"):
        spec_of("-n", "1", "x", hostfile_text="s1 role=server\n", tmp_path=tmp_path)
    with pytest.raises(HostfileError, match="every host is marked role=worker: no host for the 1 server"):
        spec_of("-n", "1", "x", hostfile_text="w1 role=worker\n", tmp_path=tmp_path)


def test_a_server_moved_off_a_dead_host_stays_on_the_server_hosts(tmp_path):
    spec = spec_of("-n", "2", "-s", "2", "--max-restarts", "1", "x",
                   hostfile_text="w1\nw2\ns1 role=server\ns2 role=server\n", tmp_path=tmp_path)
    cmds = {c.name: c for c in ssh.build_commands(spec, JOB, {})}

    class Running:
        running = [type("P", (), {"cmd": c})() for n, c in cmds.items() if n != "server 0"]

    move = ssh.Relocation(spec, JOB, ENV, answers=lambda host: host.name != "s1")
    assert move(cmds["server 0"], 255, True, Running()).host == "s2"    # not w1/w2, which run fewer


# --- env ----------------------------------------------------------------------------------

def test_forwarded_env_is_an_allow_list():
    assert tracker.forwarded_env(ENV) == {"PS_VERBOSE": "1", "PS_SECRET_FILE": "/etc/ps/secret",
                                          "OMP_NUM_THREADS": "4", "PYTHONPATH": "/src",
                                          "MXNET_ENGINE_TYPE": "NaiveEngine"}


def test_task_env_gets_only_its_role_env():
    spec = spec_of("-n", "2", "-s", "1", "--env", "A:1", "--env-server", "S:1", "--env-worker", "W:1", "x")
    server, _, worker1 = place(1, 2, [Host("a"), Host("b")])
    assert tracker.task_env(spec, server, JOB, node_host=True) == {
        **JOB, "DMLC_ROLE": "server", "DMLC_TASK_ID": "0", "DMLC_RANK": "0", "DMLC_NODE_HOST": "a",
        "A": "1", "S": "1"}
    assert tracker.task_env(spec, worker1, JOB) == {
        **JOB, "DMLC_ROLE": "worker", "DMLC_TASK_ID": "2", "DMLC_RANK": "1", "A": "1", "W": "1"}


def test_scheduler_env_and_ip(tmp_path):
    spec = spec_of("-n", "2", "-s", "1", "--env", "PS_HEARTBEAT_TIMEOUT:9", "x")
    assert tracker.scheduler_env(spec, "127.0.0.1", ENV) == {
        "PS_VERBOSE": "1", "PS_SECRET_FILE": "/etc/ps/secret", "PS_HEARTBEAT_TIMEOUT": "9",
        "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "0",
        "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2"}
    assert tracker.scheduler_ip(spec, {}) == "127.0.0.1"
    lo = spec_of("-n", "1", "x", hostfile_text="127.0.0.1\n127.0.0.2:2222\n", tmp_path=tmp_path)
    assert tracker.scheduler_ip(lo, {}) == "127.0.0.1"
    assert tracker.scheduler_ip(spec_of("-n", "1", "--host-ip", "10.1.2.3", "x"), {}) == "10.1.2.3"
    assert tracker.scheduler_ip(spec, {"DMLC_INTERFACE": "lo"}) == "127.0.0.1"


@pytest.mark.process
def test_rank_wrapper_maps_cluster_ranks_and_reports_status():
    spec = spec_of("-n", "2", "-s", "3", "x")
    argv = tracker.rank_wrapper(spec, "worker", ["sh", "-c", 'echo "$DMLC_RANK $DMLC_TASK_ID"; exit 7'])
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        res = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", var: "1"}, capture_output=True, text=True,
                             check=False, timeout=10)
        assert (res.returncode, res.stdout, res.stderr) == (7, "1 4\n", f"{EXIT_MARKER} 7\n")
    res = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", "SGE_TASK_ID": "2"}, capture_output=True,
                         text=True, check=False, timeout=10)
    assert res.stdout == "1 4\n"


# --- backends -----------------------------------------------------------------------------

def test_local_commands():
    spec = spec_of("-n", "1", "-s", "1", "python", "x.py")
    cmds = local.build_commands(spec, JOB, {"PATH": "/usr/bin"}, cwd_has_file=lambda p: False)
    assert [(c.name, c.argv) for c in cmds] == [("server 0", ("python", "-m", "ps")),
                                                ("worker 0", ("python", "x.py"))]
    assert cmds[1].env == {"PATH": "/usr/bin", **JOB, "DMLC_ROLE": "worker", "DMLC_TASK_ID": "1", "DMLC_RANK": "0"}
    inherited = local.commands(spec, JOB, {"PATH": "/usr/bin", "PORT": "8080", "DMLC_NODE_HOST": "x", "A": "1"})
    assert inherited[0].env == {"PATH": "/usr/bin", "A": "1", **JOB, "DMLC_ROLE": "server", "DMLC_TASK_ID": "0",
                                "DMLC_RANK": "0"}  # a stray PORT or DMLC_NODE_HOST would reach everyone
    shell = local.build_commands(spec_of("-n", "1", "cd /x && python y.py"), JOB, {}, cwd_has_file=lambda p: False)
    assert shell[1].argv == ("/bin/sh", "-c", "cd /x && python y.py")
    bare = local.build_commands(spec_of("-n", "1", "train.sh", "a"), JOB, {"PATH": "/nonexistent"},
                                cwd_has_file=lambda p: p == "/work/job/train.sh")
    assert bare[1].argv == ("./train.sh", "a")


@pytest.mark.process
def test_ssh_commands(tmp_path):
    spec = spec_of("-n", "2", "-s", "1", "--env-worker", "Q:it's \"q\" $X", "python3", "t.py", "a b",
                   hostfile_text="10.0.0.1:2222\n10.0.0.2\n", tmp_path=tmp_path)
    cmds = ssh.build_commands(spec, JOB, {"PYTHONPATH": "/src"})
    assert [c.argv[:-1] for c in cmds] == [
        ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15",
         "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-p", "2222", "10.0.0.1"),
        ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15",
         "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "10.0.0.2"),
        ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15",
         "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-p", "2222", "10.0.0.1")]
    assert all(c.keep_stdin and c.env is None for c in cmds)
    script = cmds[2].argv[-1]
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in {
        "PYTHONPATH": "/src", **JOB, "DMLC_ROLE": "worker", "DMLC_TASK_ID": "2", "DMLC_RANK": "1",
        "DMLC_NODE_HOST": "10.0.0.1", "Q": "it's \"q\" $X"}.items())
    assert script == f"{exports}cd /work/job || exit 1; {ssh.WATCHDOG}python3 t.py 'a b'; exit $?"
    assert "s3cr3t" not in " ".join(" ".join(c.argv) for c in ssh.commands(spec, JOB, ENV))
    # the remote shell sees exactly the values given (run the exports in sh)
    res = subprocess.run(["sh", "-c", exports + 'printf "%s|" "$Q" "$DMLC_NODE_HOST"'], capture_output=True,
                         text=True, check=False, timeout=10)
    assert res.stdout == "it's \"q\" $X|10.0.0.1|"


def test_a_restart_moves_off_a_host_that_no_longer_answers_ssh(tmp_path):
    """--max-restarts over ssh: ssh's own failure (255) or a process the launcher stopped as
    unreachable is started again on the live host running the fewest of the job's processes,
    once its own host does not answer ``ssh host true``."""
    spec = spec_of("-n", "3", "-s", "3", "--max-restarts", "2", "x", hostfile_text="h1\nh2\nh3\nh4\n",
                   tmp_path=tmp_path)
    down, asked = {"h3"}, []

    def answers(host):
        asked.append(host.name)
        return host.name not in down

    cmds = {c.name: c for c in ssh.build_commands(spec, JOB, {})}
    assert [cmds[n].host for n in ("server 0", "server 1", "server 2", "worker 0", "worker 1", "worker 2")] == \
        ["h1", "h2", "h3", "h4", "h1", "h2"]

    class Running:              # what Relocation reads of the Job: its running processes' commands
        def __init__(self, *gone):
            self.running = [type("P", (), {"cmd": c})() for n, c in cmds.items() if n not in gone]

    move = ssh.Relocation(spec, JOB, ENV, answers=answers)
    assert move(cmds["server 2"], 137, False, Running("server 2")) is cmds["server 2"]   # killed: its host is fine
    assert asked == []
    assert move(cmds["worker 0"], 255, False, Running("worker 0")) is cmds["worker 0"]   # ssh failed, host answers
    assert asked == ["h4"]
    new = move(cmds["server 2"], 137, True, Running("server 2"))                       # unreachable: h3 is down
    assert new.host == "h4" and new.name == "server 2"                                 # h4 ran 1, h1 and h2 ran 2
    assert "export DMLC_NODE_HOST=h4; " in new.argv[-1] and "export DMLC_RANK=2; " in new.argv[-1]
    assert "export DMLC_ROLE=server; " in new.argv[-1] and new.argv[-2] == "h4"
    down.add("h4")                                                                      # h4 dies too
    again = move(new, 255, False, Running("server 2"))
    assert again.host == "h1" and "export DMLC_NODE_HOST=h1; " in again.argv[-1]     # h1: 2, h2: 2, h1 first
    down.update({"h1", "h2"})
    assert move(again, 255, False, Running("server 2")) is again                      # nowhere to go: logged


def test_rsync_once_per_distinct_host(tmp_path):
    spec = spec_of("-n", "4", "-s", "2", "--sync-dst-dir", "/dst", "x",
                   hostfile_text="a:2222\nb\na:2222\n", tmp_path=tmp_path)
    assert ssh.rsync_commands(spec) == [
        ["rsync", "-az", "--rsh=ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=15 "
         "-o ServerAliveInterval=15 -o ServerAliveCountMax=4 -p 2222",
         "/work/job/", "a:/dst"],
        ["rsync", "-az", "--rsh=ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=15 "
         "-o ServerAliveInterval=15 -o ServerAliveCountMax=4", "/work/job/", "b:/dst"]]
    assert ssh.workdir(spec) == "/dst"


def test_mpi_commands(tmp_path):
    spec = spec_of("-n", "3", "-s", "1", "--env-worker", "W:1", "python3", "t.py",
                   hostfile_text="h1 slots=2\nh2 slots=2\n", tmp_path=tmp_path)
    fwd = {"PYTHONPATH": "/src"}
    server_env = ["PYTHONPATH", *JOB, "DMLC_ROLE"]
    ompi = mpi.build_commands(spec, JOB, fwd, {"PATH": "/usr/bin"}, "openmpi", as_root=True)
    wrap = tracker.rank_wrapper(spec, "worker", ["python3", "t.py"])
    assert ompi[1].argv == tuple(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", "3", "-H", "h2:2,h1:1"]
        + [a for n in [*server_env, "W"] for a in ("-x", n)] + wrap)
    assert ompi[0].argv[:8] == ("mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", "1",
                                "-H", "h1:1")
    assert ompi[1].env == {"PATH": "/usr/bin", **fwd, **JOB, "DMLC_ROLE": "worker", "W": "1"}
    mpich = mpi.build_commands(spec, JOB, fwd, {}, "mpich", as_root=True)
    assert mpich[1].argv == tuple(["mpirun", "-prepend-rank", "-np", "3", "-hosts", "h2:2,h1:1", "-genvlist",
                                   ",".join([*server_env, "W"])] + wrap)
    local_ompi = mpi.build_commands(spec_of("-n", "1", "x"), JOB, {}, {}, "openmpi", as_root=False)
    assert local_ompi[0].argv[:5] == ("mpirun", "--oversubscribe", "--tag-output", "-np", "1")


def test_mpi_output_labels():
    ompi = mpi.labeler("openmpi", "worker", "mpirun workers")
    assert ompi("[1,3]<stdout>:hello [x]") == [("worker 3", "hello [x]")]
    assert ompi("[1,1]<stdout>:bye[1,1]<stdout>:") == [("worker 1", "bye")]
    assert ompi("[1,0]<stdout>:rank=0[1,1]<stdout>:rank=1 line") == [("worker 1", "rank=1 line")]
    assert ompi("[1,0]<stdout>: end") == [("worker 0", "rank=0 end")]
    assert ompi("mpirun noticed something") == [("mpirun workers", "mpirun noticed something")]
    mpich = mpi.labeler("mpich", "server", "mpirun servers")
    assert mpich("[1] piece[0] whole line") == [("server 0", "whole line")]
    assert mpich("[1] ") == [("server 1", "piece")]
    assert mpich("[1] c[1] d") == [("server 1", "cd")]


def test_slurm_commands_and_labels():
    spec = spec_of("--launcher", "slurm", "-n", "2", "-s", "1", "--slurm-worker-nodes", "2", "python3", "t.py")
    cmds = slurm.build_commands(spec, JOB, {"PATH": "/usr/bin"})
    assert cmds[1].argv == tuple(["srun", "--oversubscribe", "--label", "--export=ALL", "--job-name=ps-worker",
                                  "-n", "2", "-N", "2"] + tracker.rank_wrapper(spec, "worker", ["python3", "t.py"]))
    assert cmds[0].argv[:7] == ("srun", "--oversubscribe", "--label", "--export=ALL", "--job-name=ps-server",
                                "-n", "1")
    assert cmds[1].env == {"PATH": "/usr/bin", **JOB, "DMLC_ROLE": "worker"}
    label = slurm.labeler("worker", "srun workers")
    assert label(" 1: text") == [("worker 1", "text")]
    assert label("srun: error: n1: task 1: Exited with exit code 3") == [("worker 1", f"{EXIT_MARKER} 3")]
    assert label("srun: error: n1: tasks 0-1: Exited with exit code 2") == [("worker 0", f"{EXIT_MARKER} 2")]


def test_sge_commands():
    spec = spec_of("--launcher", "sge", "-n", "2", "-s", "1", "--sge-queue", "all.q", "python3", "t.py")
    cmds, scripts = sge.build_commands(spec, JOB, {"PYTHONPATH": "/src"}, {"PATH": "/p"}, "/out")
    assert cmds[1].argv == ("qsub", "-sync", "y", "-terse", "-cwd", "-t", "1-2", "-S", "/bin/sh", "-N", "ps-worker",
                            "-o", "/out/worker.$TASK_ID.out", "-e", "/out/worker.$TASK_ID.err",
                            "-v", ",".join(["PYTHONPATH", "PATH", *JOB, "DMLC_ROLE"]), "-q", "all.q",
                            "/out/worker.sh")
    assert scripts["/out/worker.sh"] == "#!/bin/sh\n" + shlex.join(
        tracker.rank_wrapper(spec, "worker", ["python3", "t.py"])) + "\n"
    catcher = cmds[0].label
    assert catcher("4711.1-1:1") == [] and catcher.ids == ["4711"]


def test_yarn_commands():
    spec = spec_of("--launcher", "yarn", "-n", "2", "-s", "1", "--timeout", "60", "python3", "t.py")
    cmds, scripts = yarn.build_commands(spec, {"DMLC_ROLE": "ignored", "A": "1"}, {}, "yarn", "/ds.jar", "/w")
    assert cmds[0].argv == ("yarn", "jar", "/ds.jar", yarn.CLIENT, "-jar", "/ds.jar", "-appname", "ps-server",
                            "-num_containers", "1", "-container_memory", "1024", "-container_vcores", "1",
                            "-timeout", "60000", "-shell_script", "/w/server.sh",
                            "-shell_env", "DMLC_ROLE=server", "-shell_env", "A=1")
    assert scripts == {"/w/server.sh": "#!/bin/sh\nexec python3 -m ps\n", "/w/worker.sh": "#!/bin/sh\nexec python3 t.py\n"}
    catcher = IdCatcher(yarn.APP_ID, "yarn workers")
    assert catcher("INFO Submitted application application_17_0003") == [
        ("yarn workers", "INFO Submitted application application_17_0003")]
    assert catcher.ids == ["application_17_0003"]


def test_render_shows_only_what_the_launcher_adds():
    cmd = Command("worker 0", ("python", "a b.py"), {"PATH": "/bin", "X": "1 2"})
    assert render(cmd, {"PATH": "/bin"}) == "env 'X=1 2' python 'a b.py'"
    assert render(Command("w", ("ssh", "h", "cmd; x")), {}) == "ssh h 'cmd; x'"
    assert render(Command("w", ("x",), {"A": "1"}), {"A": "1", "PORT": "80"}) == "env -u PORT x"


def test_every_launcher_name_has_a_backend_with_the_whole_interface():
    from launcher.backend import BACKENDS, Backend
    from launcher.spec import LAUNCHERS
    assert set(BACKENDS) == set(LAUNCHERS)
    for name, backend in BACKENDS.items():
        assert isinstance(backend, Backend) and backend.name == name
        assert all(callable(getattr(backend, f)) for f in ("commands", "host_count", "describe", "prepare", "start"))


# --- --mode mpi: joint workers, no server processes ---------------------------------------

JOINT_JOB = {**JOB, "DMLC_NUM_SERVER": "2"}


def test_mode_mpi_starts_only_joint_workers_that_count_as_the_servers():
    spec = spec_of("-n", "2", "--mode", "mpi", "--env-server", "S:1", "--env-worker", "W:1", "python", "x.py")
    assert (spec.num_servers, spec.server_processes, spec.processes()) == (2, 0, (("worker", 2),))
    assert tracker.job_env(spec, "10.0.0.1", 9091)["DMLC_NUM_SERVER"] == "2"     # the shards are counted
    cmds = local.build_commands(spec, JOINT_JOB, {}, cwd_has_file=lambda p: False)
    assert [(c.name, c.argv) for c in cmds] == [("worker 0", ("python", "x.py")), ("worker 1", ("python", "x.py"))]
    # a joint worker is a server too: --env-server reaches it, --env-worker wins
    assert cmds[1].env == {**JOINT_JOB, "DMLC_ROLE": "joint", "DMLC_TASK_ID": "1", "DMLC_RANK": "1", "S": "1", "W": "1"}
    assert spec_of("-n", "2", "python", "x.py").processes() == (("server", 2), ("worker", 2))


def test_mode_mpi_under_every_cluster_manager_runs_one_group_of_joint_ranks(tmp_path):
    spec = spec_of("-n", "3", "--mode", "mpi", "--launcher", "mpi", "python3", "t.py",
                   hostfile_text="h1\nh2\nh3\n", tmp_path=tmp_path)
    ompi = mpi.build_commands(spec, JOB, {}, {}, "openmpi", as_root=False)
    assert [c.name for c in ompi] == ["mpirun workers"]
    assert ompi[0].argv[:7] == ("mpirun", "--oversubscribe", "--tag-output", "-np", "3", "-H", "h1:1,h2:1,h3:1")
    assert ompi[0].env["DMLC_ROLE"] == "joint"
    assert tracker.rank_wrapper(spec, "worker", ["x"])[2] == tracker.RANK_SCRIPT % (0, EXIT_MARKER)  # task ids 0..
    srun = slurm.build_commands(spec_of("-n", "2", "--mode", "mpi", "--launcher", "slurm", "t"), JOB, {})
    assert [c.name for c in srun] == ["srun workers"] and srun[0].env["DMLC_ROLE"] == "joint"
    qsub, scripts = sge.build_commands(spec_of("-n", "2", "--mode", "mpi", "--launcher", "sge", "t"), JOB, {}, {}, "/o")
    assert [c.name for c in qsub] == ["qsub workers"] and list(scripts) == ["/o/worker.sh"]
    yarn_cmds, _ = yarn.build_commands(spec_of("-n", "2", "--mode", "mpi", "--launcher", "yarn", "t"), {}, {},
                                       "yarn", "/ds.jar", "/w")
    assert [c.name for c in yarn_cmds] == ["yarn workers"] and "DMLC_ROLE=joint" in yarn_cmds[0].argv
