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
from collections.abc import Mapping

from .hosts import Host, Task, distinct, place
from .process import Command, run_quiet
from .spec import LaunchSpec, is_shell_string, shell_join
from .tracker import forwarded_env, task_env

logger = logging.getLogger(__name__)

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new")
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


def ssh_argv(host: Host, *remote: str) -> list[str]:
    port = ["-p", str(host.port)] if host.port else []
    return ["ssh", *SSH_OPTIONS, *port, host.name, *remote]


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
    key = b""
    if spec.job_key:                         # the key the launcher made for this job (secret.py)
        with open(spec.job_key, "rb") as f:
            key = f.read().strip() + b"\n"
    cmds = []
    for task in place(spec.num_servers, spec.num_workers, spec.hosts):
        env = {**forward, **task_env(spec, task, job, node_host=True)}
        script = remote_script(env, workdir(spec), spec.role_command(task.role), key_from_stdin=bool(key))
        assert task.host is not None
        cmds.append(Command(task.name, tuple(ssh_argv(task.host, script)), None, task.host.name, keep_stdin=True,
                            stdin_first=key))
    return cmds


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    return build_commands(spec, job, forwarded_env(environ))


def used_hosts(spec: LaunchSpec) -> list[Host]:
    tasks: list[Task] = place(spec.num_servers, spec.num_workers, spec.hosts)
    return distinct(t.host for t in tasks)


def host_count(spec: LaunchSpec) -> int:
    return len({h.name for h in used_hosts(spec)})


def rsync_commands(spec: LaunchSpec) -> list[list[str]]:
    """--sync-dst-dir: one rsync per distinct host actually used (MXNet #17470: not per process)."""
    assert spec.sync_dst_dir
    out = []
    for host in used_hosts(spec):
        rsh = shlex.join(["ssh", *SSH_OPTIONS] + (["-p", str(host.port)] if host.port else []))
        out.append(["rsync", "-az", f"--rsh={rsh}", spec.cwd.rstrip("/") + "/", f"{host.name}:{spec.sync_dst_dir}"])
    return out


def prepare(spec: LaunchSpec, environ: Mapping[str, str], timeout: float = 600.0) -> None:
    """Copy the working directory to every host in parallel; raise if any copy fails."""
    if not spec.sync_dst_dir:
        return
    errors: list[str] = []

    def sync(argv: list[str]) -> None:
        try:
            res = run_quiet(argv, timeout)
        except Exception as exc:  # TimeoutExpired, OSError (no rsync)
            errors.append(f"{argv[-1]}: {exc}")
            return
        if res.returncode:
            errors.append(f"{argv[-1]}: rsync exited {res.returncode}: {res.stderr.strip()}")

    threads = [threading.Thread(target=sync, args=(argv,), name="ps-launch-rsync") for argv in rsync_commands(spec)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise RuntimeError("--sync-dst-dir failed: " + "; ".join(errors))
    logger.info("synced %s to %s on %d host(s)", spec.cwd, spec.sync_dst_dir, len(threads))
