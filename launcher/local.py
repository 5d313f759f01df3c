"""local: every process on this machine, each in its own process group (dmlc ``local``)."""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from .hosts import place
from .process import Command
from .spec import LaunchSpec, local_argv
from .tracker import inherited_env, task_env


def build_commands(spec: LaunchSpec, job: Mapping[str, str], base_env: Mapping[str, str],
                   cwd_has_file=os.path.isfile) -> list[Command]:
    """One Command per process; env = the launcher's environment + the task's DMLC_* + --env*."""
    cmds = []
    for task in place(spec.server_processes, spec.num_workers):
        argv = local_argv(spec.role_command(task.role))
        if "/" not in argv[0] and shutil.which(argv[0], path=base_env.get("PATH")) is None \
                and cwd_has_file(os.path.join(spec.cwd, argv[0])):
            argv[0] = "./" + argv[0]  # dmlc: a bare file name in the cwd is run from there
        cmds.append(Command(task.name, tuple(argv), {**base_env, **task_env(spec, task, job)}, "localhost"))
    return cmds


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    return build_commands(spec, job, inherited_env(environ))


def host_count(spec: LaunchSpec) -> int:
    return 1
