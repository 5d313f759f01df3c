"""sge: one ``qsub -sync y`` array job per role (``-v DMLC_ROLE``...), output followed from files.

Each task runs a small generated script (quoting survives, unlike ``qsub -b y``) that sets
DMLC_RANK/DMLC_TASK_ID from ``SGE_TASK_ID`` and reports a non-zero exit status. Task output
goes to ``<dir>/<role>.<task>.out|err`` (``dir`` = --log-dir, else ``.ps-launch-sge-<pid>`` in the
working directory, which the execution hosts must share; removed at the end), and the
launcher follows those files to print ``[worker r]`` lines. On a stop the jobs are deleted with ``qdel <job id>``.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping

from .output import IdCatcher, deliver
from .process import Command, Job, run_quiet
from .spec import LaunchSpec, local_argv, shell_join
from .tracker import forwarded_env, inherited_env, rank_wrapper, role_env

logger = logging.getLogger(__name__)

JOB_ID = r"^(\d+)(?:\.\S+)?$"  # qsub -terse: "123" or "123.1-4:1"


def output_dir(spec: LaunchSpec) -> str:
    return os.path.abspath(spec.log_dir or os.path.join(spec.cwd, f".ps-launch-sge-{os.getpid()}"))


def script_text(spec: LaunchSpec, role: str) -> str:
    return "#!/bin/sh\n" + shell_join(rank_wrapper(spec, role, local_argv(spec.role_command(role)))) + "\n"


def build_commands(spec: LaunchSpec, job: Mapping[str, str], forward: Mapping[str, str],
                   base_env: Mapping[str, str], outdir: str) -> tuple[list[Command], dict[str, str]]:
    """(qsub Commands, {script path: script text}). Values go by name: ``-v NAME`` takes the
    value from qsub's environment."""
    cmds, scripts = [], {}
    for role, n in spec.processes():
        # PATH too (dmlc passed it): an execution host's default PATH may lack the interpreter
        env = {**forward, **({"PATH": base_env["PATH"]} if "PATH" in base_env else {}), **role_env(spec, role, job)}
        script = os.path.join(outdir, f"{role}.sh")
        scripts[script] = script_text(spec, role)
        argv = ["qsub", "-sync", "y", "-terse", "-cwd", "-t", f"1-{n}", "-S", "/bin/sh", "-N", f"ps-{role}",
                "-o", os.path.join(outdir, role + ".$TASK_ID.out"),
                "-e", os.path.join(outdir, role + ".$TASK_ID.err"), "-v", ",".join(env)]
        argv += ["-q", spec.sge_queue] if spec.sge_queue else []
        name = f"qsub {role}s"
        cmds.append(Command(name, tuple(argv + [script]), {**base_env, **env}, None,
                            label=IdCatcher(JOB_ID, name, swallow=True)))
    return cmds, scripts


def commands(spec: LaunchSpec, job: Mapping[str, str], environ: Mapping[str, str],
             dry_run: bool = False) -> list[Command]:
    outdir = output_dir(spec)
    cmds, scripts = build_commands(spec, job, forwarded_env(environ), inherited_env(environ), outdir)
    if not dry_run:
        os.makedirs(outdir, exist_ok=True)
        for path in task_files(spec, outdir):  # SGE appends: output of an earlier run would be replayed
            if os.path.exists(path):
                os.remove(path)
        for path, text in scripts.items():
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o755)
    return cmds


def task_files(spec: LaunchSpec, outdir: str) -> dict[str, tuple[str, bool]]:
    """{output file: (source name, is stderr)} for every task of the job."""
    return {os.path.join(outdir, f"{role}.{t}.{ext}"): (f"{role} {t - 1}", ext == "err")
            for role, n in spec.processes()
            for t in range(1, n + 1) for ext in ("out", "err")}


def host_count(spec: LaunchSpec) -> int | None:
    return None


def describe(spec: LaunchSpec) -> list[str]:
    """--dry-run: the scripts the commands name."""
    return [f"# {os.path.join(output_dir(spec), role + '.sh')}: {script_text(spec, role).splitlines()[-1]}"
            for role, _ in spec.processes()]


def start(spec: LaunchSpec, job: Job, cmds: list[Command]) -> None:
    """Submit, follow the task output files, qdel the jobs on a stop."""
    procs = [job.spawn(cmd) for cmd in cmds]
    follower = Follower(job, task_files(spec, output_dir(spec)), lambda: all(p.poll() is not None for p in procs))

    def stop() -> None:
        if any(p.poll() is None for p in procs):
            qdel([i for c in cmds for i in c.label.ids])  # type: ignore[union-attr]
    job.add_stop_hook(stop)
    job.add_stop_hook(follower.close)
    if not spec.log_dir:  # our scratch directory, once qsub (and so every task) has ended
        job.add_cleanup(lambda: shutil.rmtree(output_dir(spec), ignore_errors=True))
    follower.start()


def qdel(ids: list[str]) -> None:
    if ids:
        res = run_quiet(["qdel", *ids], timeout=30)
        logger.debug("qdel %s: %s%s", " ".join(ids), res.stdout.strip(), res.stderr.strip())


class Follower(threading.Thread):
    """Tails ``<role>.<task>.out|err`` and prints them as ``[role rank]`` lines."""

    def __init__(self, job: Job, files: dict[str, tuple[str, bool]], finished: Callable[[], bool]) -> None:
        super().__init__(name="ps-launch-sge-follow", daemon=True)
        self.job, self.output, self.files, self.finished = job, job.output, files, finished
        self.offsets = dict.fromkeys(files, 0)
        self.partial = dict.fromkeys(files, b"")
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            done = self.finished()
            self.drain()
            if done:
                return
            self._done.wait(0.2)

    def close(self) -> None:
        self._done.set()
        self.join(5)
        self.drain()
        for path, rest in self.partial.items():  # a last line without its newline
            if rest:
                self.partial[path] = b""
                self._deliver(path, rest)

    def drain(self) -> None:
        for path in self.files:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            self.offsets[path] += len(data)
            *lines, self.partial[path] = (self.partial[path] + data).split(b"\n")
            for raw in lines:
                self._deliver(path, raw)

    def _deliver(self, path: str, raw: bytes) -> None:
        source, err = self.files[path]
        deliver(self.output, self.job.report_exit, source, raw.decode("utf-8", "replace").rstrip("\r"), err)
