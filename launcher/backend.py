"""The one interface every launcher backend has, and the table of backends.

A backend module provides ``commands`` (pure: the argv and env of every process, testable
without starting anything) and ``host_count``; the other steps are optional and default
to doing nothing special. The table below says which module provides which, so the
launcher never probes a module for what it might have.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import kubejob, local, mpi, sge, slurm, ssh, yarn
from .output import Output
from .process import Command, Job, StopSignal
from .spec import LaunchSpec
from .supervise import Relocate

Commands = Callable[[LaunchSpec, Mapping[str, str], Mapping[str, str], bool], "list[Command]"]


def _no_description(spec: LaunchSpec) -> list[str]:
    return []


def _nothing_to_prepare(spec: LaunchSpec, environ: Mapping[str, str]) -> None:
    return None


def spawn_each(spec: LaunchSpec, job: Job, cmds: list[Command]) -> None:
    """Start every command as a process of the job (all but the batch schedulers)."""
    for cmd in cmds:
        job.spawn(cmd)


@dataclass(frozen=True)
class Backend:
    name: str
    commands: Commands                                  # (spec, job env, launcher env, dry_run)
    host_count: Callable[[LaunchSpec], "int | None"]    # None: the cluster manager decides
    describe: Callable[[LaunchSpec], list[str]] = _no_description   # extra --dry-run lines
    prepare: Callable[[LaunchSpec, Mapping[str, str]], None] = _nothing_to_prepare  # before the scheduler
    start: Callable[[LaunchSpec, Job, list[Command]], None] = spawn_each
    # (spec, job env, launcher env) -> where --max-restarts starts a restart; None: where it ran
    relocation: Callable[[LaunchSpec, Mapping[str, str], Mapping[str, str]], Relocate] | None = None
    # (spec, launcher env, output, stop) -> exit status: the backend runs the whole job itself,
    # scheduler included (kubernetes: the cluster runs every process); None: the launcher does
    run: Callable[[LaunchSpec, Mapping[str, str], Output, StopSignal | None], int] | None = None


BACKENDS: dict[str, Backend] = {
    "local": Backend("local", local.commands, local.host_count),
    "ssh": Backend("ssh", ssh.commands, ssh.host_count, prepare=ssh.prepare, relocation=ssh.Relocation),
    "mpi": Backend("mpi", mpi.commands, mpi.host_count),
    "slurm": Backend("slurm", slurm.commands, slurm.host_count),
    "sge": Backend("sge", sge.commands, sge.host_count, describe=sge.describe, start=sge.start),
    "yarn": Backend("yarn", yarn.commands, yarn.host_count, describe=yarn.describe, start=yarn.start),
    "kubernetes": Backend("kubernetes", kubejob.commands, kubejob.host_count, run=kubejob.run),
}
