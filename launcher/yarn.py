"""yarn: Hadoop's own DistributedShell, one application per role.

The documented command (Hadoop 2.x/3.x, ``hadoop-yarn-applications-distributedshell``)::

    yarn jar $JAR org.apache.hadoop.yarn.applications.distributedshell.Client -jar $JAR \\
         -appname ps-worker -num_containers N -shell_script worker.sh -shell_env K=V ...

Containers get their env through ``-shell_env`` and run a generated script with the
command (paths must exist on the cluster nodes). YARN picks the nodes and assigns no
per-container index, so ranks come from the scheduler, output stays in the container logs
(``yarn logs -applicationId <id>``), and a stop runs ``yarn application -kill <id>``.
"""
from __future__ import annotations

import glob
import logging
import os
import shutil
from collections.abc import Mapping

from .output import IdCatcher
from .process import Command, Job, run_quiet
from .spec import LaunchSpec, is_shell_string, shell_join
from .tracker import forwarded_env, role_env

logger = logging.getLogger(__name__)

CLIENT = "org.apache.hadoop.yarn.applications.distributedshell.Client"
APP_ID = r"(application_\d+_\d+)"
FOREVER_MS = 365 * 24 * 3600 * 1000  # the client kills the app after -timeout (default 10 min)


def find_jar(environ: Mapping[str, str]) -> str:
    for var in ("HADOOP_YARN_HOME", "HADOOP_HOME"):
        home = environ.get(var)
        if home:
            jars = sorted(glob.glob(os.path.join(
                home, "share", "hadoop", "yarn", "hadoop-yarn-applications-distributedshell-*.jar")))
            jars = [j for j in jars if not j.endswith(("-tests.jar", "-sources.jar"))]
            if jars:
                return jars[-1]
    raise RuntimeError("--launcher yarn needs HADOOP_HOME (or HADOOP_YARN_HOME) pointing at a Hadoop "
                       "install with share/hadoop/yarn/hadoop-yarn-applications-distributedshell-*.jar")


def yarn_binary(environ: Mapping[str, str]) -> str:
    if shutil.which("yarn", path=environ.get("PATH")):
        return "yarn"
    for var in ("HADOOP_YARN_HOME", "HADOOP_HOME"):
        if environ.get(var) and os.access(os.path.join(environ[var], "bin", "yarn"), os.X_OK):
            return os.path.join(environ[var], "bin", "yarn")
    return "yarn"


def script_text(spec: LaunchSpec, role: str) -> str:
    command = spec.role_command(role)
    run = command[0] if is_shell_string(command) else "exec " + shell_join(command)
    return f"#!/bin/sh\n{run}\n"


def build_commands(spec: LaunchSpec, job: Mapping[str, str], forward: Mapping[str, str], yarn: str,
                   jar: str, workdir: str) -> tuple[list[Command], dict[str, str]]:
    cmds, scripts = [], {}
    timeout_ms = int(spec.timeout * 1000) if spec.timeout else FOREVER_MS
    for role, n in spec.processes():
        script = os.path.join(workdir, f"{role}.sh")
        scripts[script] = script_text(spec, role)
        argv = [yarn, "jar", jar, CLIENT, "-jar", jar, "-appname", f"ps-{role}",
                "-num_containers", str(n), "-container_memory", "1024", "-container_vcores", "1",
                "-timeout", str(timeout_ms), "-shell_script", script]
        argv += ["-queue", spec.yarn_queue] if spec.yarn_queue else []
        for k, v in {**forward, **role_env(spec, role, job)}.items():
            argv += ["-shell_env", f"{k}={v}"]
        name = f"yarn {role}s"
        cmds.append(Command(name, tuple(argv), None, None, label=IdCatcher(APP_ID, name)))
    return cmds, scripts


def workdir(spec: LaunchSpec) -> str:
    return os.path.abspath(spec.log_dir or os.path.join(spec.cwd, f".ps-launch-yarn-{os.getpid()}"))


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    cmds, scripts = build_commands(spec, job, forwarded_env(environ), yarn_binary(environ),
                                   find_jar(environ), workdir(spec))
    if not dry_run:
        os.makedirs(workdir(spec), exist_ok=True)
        for path, text in scripts.items():
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    return cmds


def host_count(spec: LaunchSpec) -> int | None:
    return None


def describe(spec: LaunchSpec) -> list[str]:
    """--dry-run: the scripts the commands name."""
    return [f"# {os.path.join(workdir(spec), role + '.sh')}: {script_text(spec, role).splitlines()[-1]}"
            for role, _ in spec.processes()]


def start(spec: LaunchSpec, job: Job, cmds: list[Command]) -> None:
    procs = [job.spawn(cmd) for cmd in cmds]
    yarn = cmds[0].argv[0]

    def kill() -> None:
        if all(p.poll() is not None for p in procs):
            return  # the applications ended with their clients
        for app in [i for c in cmds for i in c.label.ids]:  # type: ignore[union-attr]
            res = run_quiet([yarn, "application", "-kill", app], timeout=60)
            logger.debug("yarn application -kill %s: exit %d", app, res.returncode)
    job.add_stop_hook(kill)
    if not spec.log_dir:
        job.add_cleanup(lambda: shutil.rmtree(workdir(spec), ignore_errors=True))
