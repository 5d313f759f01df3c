"""slurm: one ``srun`` per role; ranks from ``SLURM_PROCID``, output tagged with ``--label``.

dmlc's ``srun --share`` no longer exists (Slurm >= 17); ``--oversubscribe`` replaced it.
The environment reaches the tasks through srun's default ``--export=ALL``.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from .output import EXIT_MARKER
from .process import Command
from .spec import LaunchSpec, local_argv
from .tracker import inherited_env, rank_wrapper, role_env

_LABEL = re.compile(r"^\s*(\d+): (.*)$")
_EXITED = re.compile(r"^srun: error: \S+: tasks? (\d+)(?:-\d+)?: Exited with exit code (\d+)$")


def labeler(role: str, fallback: str):
    def label(line: str) -> list[tuple[str, str]]:
        m = _LABEL.match(line)
        if m:
            return [(f"{role} {m.group(1)}", m.group(2))]
        m = _EXITED.match(line)  # srun's own report: authoritative, and it survives a killed step
        if m:
            return [(f"{role} {m.group(1)}", f"{EXIT_MARKER} {m.group(2)}")]
        return [(fallback, line)]
    return label


def build_commands(spec: LaunchSpec, job: Mapping[str, str], base_env: Mapping[str, str]) -> list[Command]:
    cmds = []
    nodes_of = {"server": spec.slurm_server_nodes, "worker": spec.slurm_worker_nodes}
    for role, n in spec.processes():
        nodes = nodes_of[role]
        argv = ["srun", "--oversubscribe", "--label", "--export=ALL",
                f"--job-name=ps-{role}", "-n", str(n)]
        argv += ["-N", str(nodes)] if nodes else []
        argv += rank_wrapper(spec, role, local_argv(spec.role_command(role)))
        name = f"srun {role}s"
        cmds.append(Command(name, tuple(argv), {**base_env, **role_env(spec, role, job)}, None,
                            label=labeler(role, name)))
    return cmds


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    return build_commands(spec, job, inherited_env(environ))


def host_count(spec: LaunchSpec) -> int | None:
    return None  # Slurm picks the nodes
