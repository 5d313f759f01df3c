"""ssh: ``ssh [-p port] host '<exports>; cd <dir>; <cmd>'`` per process, dmlc placement.

Remote processes are stopped through their ssh connection: the remote shell starts a
watchdog that waits for EOF on the connection's stdin, which comes when the launcher closes
the pipe (a job stop or the job's end) or when the ssh client dies (launcher killed, network
lost). It then sends SIGTERM, and after up to 3 s SIGKILL, to the remote process group
(sshd makes the remote shell a session leader; the command runs in its group). Nothing is
killed by name, and no tty is needed, so stdout and stderr stay apart.

The command is not exec'ed: the shell waits for it and exits with its status, so a remote
process killed by a signal reaches the launcher as 128 + N ("was killed by SIGKILL"). Exec'ed,
sshd would report the signal itself and the ssh client would exit 255, as for a lost connection.
"""
from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Callable, Mapping

from .hosts import Host, Task, distinct, hosts_for, place
from .process import Command, Job, run_quiet
from .spec import LaunchSpec, is_shell_string, shell_join
from .tracker import forwarded_env, task_env

logger = logging.getLogger(__name__)

# ConnectTimeout: a host that is down (no answer at all, not even a refusal) fails a start or a
# restart in seconds, not after the kernel's two minutes of SYN retries. ServerAlive: an ssh
# client whose host went silent (power, network) exits 255 after a minute instead of waiting
# for TCP's keepalive (hours); PS_HEARTBEAT_TIMEOUT (30 s) catches the node itself first.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
SSH_FAILED = 255     # ssh's own status: it could not connect, or lost the connection
# The watchdog runs in its own process group (set -m; a shell without job control keeps it
# in the command's group, which then only costs the 3 s), waits for EOF, TERMs the command's
# group, polls it for up to 3 s, then KILLs what is left (only while the group still exists).
# `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash's kill rejects the `--`. It then removes
# the job key file KEY_FROM_STDIN made, if any.
WATCHDOG = ('exec 3<&0; set -m 2>/dev/null; ( trap "" TERM INT HUP; cat >/dev/null; kill -TERM -$$ 2>/dev/null; '
            'n=0; while [ $n -lt 30 ] && kill -0 -$$ 2>/dev/null; do sleep 0.1; n=$((n+1)); done; '
            'kill -KILL -$$ 2>/dev/null; [ -z "$_ps_key" ] || rm -f "$_ps_key" ) <&3 >/dev/null 2>&1 & '
            'set +m; exec 3<&- </dev/null; ')
# The job's signing key arrives as the first line on stdin (the launcher writes it there:
# never in argv, which `ps` shows, or in the environment); `read` takes that line only, and
# mktemp makes the file 0600.
KEY_FROM_STDIN = ('_ps_key=$(mktemp "${TMPDIR:-/tmp}/ps-job-key.XXXXXX") || exit 1; '
                  'IFS= read -r _ps_k || exit 1; printf "%s" "$_ps_k" > "$_ps_key"; _ps_k=; '
                  'export PS_JOB_KEY_FILE="$_ps_key"; ')


def ssh_argv(host: Host, *remote: str, first: tuple[str, ...] = ()) -> list[str]:
    """``first``: options that win over SSH_OPTIONS (ssh takes the first value of each)."""
    port = ["-p", str(host.port)] if host.port else []
    return ["ssh", *first, *SSH_OPTIONS, *port, host.name, *remote]


def remote_script(env: Mapping[str, str], cwd: str, command: tuple[str, ...], key_from_stdin: bool = False) -> str:
    """The remote shell command: quoted exports, the job key, cd, watchdog, then the command."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items() if not (key_from_stdin and k == "PS_JOB_KEY_FILE"))
    run = command[0] if is_shell_string(command) else shell_join(command)
    key = KEY_FROM_STDIN if key_from_stdin else ""
    return f"{exports}{key}cd {shlex.quote(cwd)} || exit 1; {WATCHDOG}{run}; exit $?"


def workdir(spec: LaunchSpec) -> str:
    return spec.sync_dst_dir or spec.cwd


def build_commands(spec: LaunchSpec, job: Mapping[str, str], forward: Mapping[str, str]) -> list[Command]:
    """One ssh Command per process; ``forward`` = launcher env that remote processes get."""
    return [task_command(spec, task, job, forward) for task in place(spec.server_processes, spec.num_workers, spec.hosts)]


def task_command(spec: LaunchSpec, task: Task, job: Mapping[str, str], forward: Mapping[str, str]) -> Command:
    key = b""
    if spec.job_key:                         # the key the launcher made for this job (secret.py)
        with open(spec.job_key, "rb") as f:
            key = f.read().strip() + b"\n"
    env = {**forward, **task_env(spec, task, job, node_host=True)}
    script = remote_script(env, workdir(spec), spec.role_command(task.role), key_from_stdin=bool(key))
    assert task.host is not None
    return Command(task.name, tuple(ssh_argv(task.host, script)), None, task.host.name, keep_stdin=True,
                   stdin_first=key)


def host_answers(host: Host, timeout: float = 15.0) -> bool:
    """``ssh host true`` succeeds: the host is up and its sshd lets us in. A 5 s connect
    timeout (ssh takes the first value given): the launcher waits on this before restarting."""
    try:
        return run_quiet(ssh_argv(host, "true", first=("-o", "ConnectTimeout=5")), timeout).returncode == 0
    except Exception:       # TimeoutExpired, OSError
        return False


class Relocation:
    """--max-restarts over ssh: a restart runs where its node ran, unless that host no longer
    answers ssh (a dead machine): then on the live host of its role (role=server hosts keep the
    servers) running the fewest of the job's processes (a spare host first), copied there
    first with --sync-dst-dir. The scheduler takes a restart from any host."""

    def __init__(self, spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
                 answers: Callable[[Host], bool] = host_answers):
        self.spec, self.job, self.forward, self.answers = spec, job, forwarded_env(environ), answers
        self.tasks = {t.name: t for t in place(spec.server_processes, spec.num_workers, spec.hosts)}
        self.dead: set[tuple[str, int | None]] = set()
        self.synced = {h.key for h in used_hosts(spec)} if spec.sync_dst_dir else set()

    def __call__(self, cmd: Command, status: int, unreachable: bool, job: Job) -> Command:
        task = self.tasks.get(cmd.name)
        if task is None or task.host is None or not (unreachable or status == SSH_FAILED):
            return cmd                       # the process died; its host is fine
        if task.host.key not in self.dead and self.answers(task.host):
            return cmd
        self.dead.add(task.host.key)
        busy: dict[tuple[str, int | None], int] = {}
        for proc in job.running:
            where = self.tasks.get(proc.cmd.name)
            if where is not None and where.host is not None:
                busy[where.host.key] = busy.get(where.host.key, 0) + 1
        order = [h for h in distinct(hosts_for(task.role, self.spec.hosts)) if h.key not in self.dead]
        for host in sorted(order, key=lambda h: busy.get(h.key, 0)):   # stable: hostfile order on ties
            if not self.answers(host):
                logger.warning("host %s does not answer ssh either", host.name)
                self.dead.add(host.key)
                continue
            if self.spec.sync_dst_dir and host.key not in self.synced:
                sync_one(self.spec, host)
                self.synced.add(host.key)
            logger.warning("host %s does not answer ssh: %s starts on %s instead", task.host.name, cmd.name,
                           host.name)
            self.tasks[cmd.name] = task = Task(task.role, task.rank, task.task_id, host)
            return task_command(self.spec, task, self.job, self.forward)
        logger.error("host %s does not answer ssh, nor does any other host of the hostfile: %s is started "
                     "there again", task.host.name, cmd.name)
        return cmd


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    return build_commands(spec, job, forwarded_env(environ))


def used_hosts(spec: LaunchSpec) -> list[Host]:
    tasks: list[Task] = place(spec.server_processes, spec.num_workers, spec.hosts)
    return distinct(t.host for t in tasks)


def host_count(spec: LaunchSpec) -> int:
    return len({h.name for h in used_hosts(spec)})


def rsync_commands(spec: LaunchSpec) -> list[list[str]]:
    """--sync-dst-dir: one rsync per distinct host actually used (MXNet #17470: not per process)."""
    return [rsync_argv(spec, host) for host in used_hosts(spec)]


def rsync_argv(spec: LaunchSpec, host: Host) -> list[str]:
    assert spec.sync_dst_dir
    rsh = shlex.join(["ssh", *SSH_OPTIONS] + (["-p", str(host.port)] if host.port else []))
    return ["rsync", "-az", f"--rsh={rsh}", spec.cwd.rstrip("/") + "/", f"{host.name}:{spec.sync_dst_dir}"]


def rsync_error(argv: list[str], timeout: float) -> str | None:
    """Run one rsync of rsync_argv; None if it worked, else why not (naming its destination)."""
    try:
        res = run_quiet(argv, timeout)
    except Exception as exc:  # TimeoutExpired, OSError (no rsync)
        return f"{argv[-1]}: {exc}"
    return f"{argv[-1]}: rsync exited {res.returncode}: {res.stderr.strip()}" if res.returncode else None


def sync_one(spec: LaunchSpec, host: Host, timeout: float = 600.0) -> None:
    """--sync-dst-dir to a host the job did not use until a restart moved there; a failure
    is logged (the restart then fails and says why)."""
    error = rsync_error(rsync_argv(spec, host), timeout)
    if error:
        logger.error("--sync-dst-dir failed: %s", error)


def prepare(spec: LaunchSpec, environ: Mapping[str, str], timeout: float = 600.0) -> None:
    """Copy the working directory to every host in parallel; raise if any copy fails."""
    if not spec.sync_dst_dir:
        return
    errors: list[str] = []

    def sync(argv: list[str]) -> None:
        error = rsync_error(argv, timeout)
        if error:
            errors.append(error)

    threads = [threading.Thread(target=sync, args=(argv,), name="ps-launch-rsync") for argv in rsync_commands(spec)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise RuntimeError("--sync-dst-dir failed: " + "; ".join(errors))
    logger.info("synced %s to %s on %d host(s)", spec.cwd, spec.sync_dst_dir, len(threads))
