"""mpi: one ``mpirun`` per role (as dmlc), Open MPI or MPICH, env forwarded by name.

Values travel in mpirun's environment and only their names on its command line
(``-x NAME`` / ``-genvlist A,B``), so remote ranks get exactly those variables and no
value is visible in a process list. The rank within the role comes from
``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK`` (tracker.rank_wrapper) and tags each output line.
"""
from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping

from .hosts import Task, place
from .process import Command, run_quiet
from .spec import LaunchSpec, local_argv
from .tracker import forwarded_env, inherited_env, rank_wrapper, role_env

# Output tags: Open MPI --tag-output and hydra -prepend-rank, both at the start of each *write*
TAGS = {"openmpi": re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:"), "mpich": re.compile(r"\[(\d+)\] ")}

# After a rank fails mpirun aborts its job itself; a SIGTERM during that abort crashes
# Open MPI 4.1's mpirun (segfault in PMIx_Finalize), so a stop gives it this long first.
STOP_DELAY = 1.5


def detect_flavor(mpirun: str = "mpirun", env: Mapping[str, str] | None = None) -> str:
    """"openmpi" or "mpich", from ``mpirun --version`` (both print on stdout)."""
    try:
        res = run_quiet([mpirun, "--version"], timeout=30, env=env)
    except FileNotFoundError:
        raise RuntimeError(f"--launcher mpi: {mpirun} is not on PATH") from None
    text = res.stdout + res.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    raise RuntimeError(f"--launcher mpi: cannot tell the MPI from `{mpirun} --version`: {text.strip()[:200]!r}")


def labeler(flavor: str, role: str, fallback: str):
    """MPI output -> ``[role rank]`` lines. Both MPIs tag every *write* of a rank, so a line
    written in pieces (unbuffered Python writes text and newline apart) and interleaved with
    another rank arrives as ``[1] text[0] whole line`` + ``[1] ``; the pieces are kept per
    rank until their newline. (A tag-like text printed by the program can fool this.)"""
    tag = TAGS[flavor]
    partial: dict[tuple[int, str], str] = {}  # (reader thread = stdout/stderr, rank) -> piece

    def label(line: str) -> list[tuple[str, str]]:
        parts = tag.split(line)  # [untagged, rank, text, rank, text, ...]
        if parts[0] or len(parts) == 1:
            return [(fallback, line)]
        stream = threading.get_ident()
        pieces = list(zip(parts[1::2], parts[2::2]))
        for rank, text in pieces[:-1]:
            partial[stream, rank] = partial.get((stream, rank), "") + text
        rank, text = pieces[-1]
        return [(f"{role} {rank}", partial.pop((stream, rank), "") + text)]
    return label


def host_list(tasks: list[Task]) -> str:
    """``h1:2,h2:1``: slots per host in first-seen order (the role's share of the placement)."""
    counts: dict[str, int] = {}
    for task in tasks:
        if task.host is not None:
            counts[task.host.name] = counts.get(task.host.name, 0) + 1
    return ",".join(f"{h}:{n}" for h, n in counts.items())


def build_commands(spec: LaunchSpec, job: Mapping[str, str], forward: Mapping[str, str],
                   base_env: Mapping[str, str], flavor: str, as_root: bool) -> list[Command]:
    tasks = place(spec.server_processes, spec.num_workers, spec.hosts)
    cmds = []
    for role, n in spec.processes():
        env = {**forward, **role_env(spec, role, job)}
        hosts = host_list([t for t in tasks if t.role == role])
        if flavor == "openmpi":
            argv = ["mpirun"] + (["--allow-run-as-root"] if as_root else [])
            argv += ["--oversubscribe", "--tag-output", "-np", str(n)]
            argv += ["-H", hosts] if hosts else []
            for name in env:
                argv += ["-x", name]
        else:
            argv = ["mpirun", "-prepend-rank", "-np", str(n)]
            argv += ["-hosts", hosts] if hosts else []
            argv += ["-genvlist", ",".join(env)]
        argv += rank_wrapper(spec, role, local_argv(spec.role_command(role)))
        name = f"mpirun {role}s"
        cmds.append(Command(name, tuple(argv), {**base_env, **env}, None,
                            label=labeler(flavor, role, name), stop_delay=STOP_DELAY))
    return cmds


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    flavor = detect_flavor(env=environ)
    return build_commands(spec, job, forwarded_env(environ), inherited_env(environ), flavor, os.geteuid() == 0)


def host_count(spec: LaunchSpec) -> int:
    return len({h.name for h in spec.hosts}) if spec.hosts else 1
