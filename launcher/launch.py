"""``python -m ps.launch`` / ``ps-launch``: MXNet ``tools/launch.py``'s command line for ps.

    python -m ps.launch -n 2 [-s 2] [-H hosts] [--launcher ssh] python train.py --lr 0.1

Everything from the first positional word on is the command, verbatim. The launcher
starts the scheduler in this process, then servers (``<python> -m ps``) and workers (the
command) through the chosen backend, prefixes their output, and returns the first non-zero
exit status of the job after stopping every process of it. ``--launcher kubernetes`` hands
the whole job, scheduler included, to the cluster instead (launcher/kubejob.py).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ps.config import value_of
from ps.errors import ConfigError

from . import kubernetes
from .backend import BACKENDS, Backend
from .hosts import HostfileError, check_roles, read_hostfile
from .output import Output, OutputHandler
from .process import Command, Job, StopSignal, become_subreaper
from .secret import job_secret
from .spec import (
    LAUNCHERS,
    LaunchSpec,
    SpecError,
    default_server_command,
    parse_env_pair,
)
from .supervise import Restarts, supervise
from .tracker import SchedulerRunner, job_env, scheduler_env, scheduler_ip

logger = logging.getLogger("launcher")



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ps.launch", allow_abbrev=False,
        description="Launch a ps (parameter server) job: a scheduler, servers and workers.",
        epilog="Everything from COMMAND on is passed to the workers unchanged. See docs/launcher.md.")
    p.add_argument("-n", "--num-workers", type=int, required=True, help="number of worker processes")
    p.add_argument("-s", "--num-servers", type=int, help="number of server processes (default: -n)")
    p.add_argument("-H", "--hostfile", help="hosts, one per line: host, host:sshport or 'host slots=N'; "
                   "'host role=server' (or role=worker) runs only that role there")
    p.add_argument("--server-hosts", metavar="FILE",
                   help="ssh/mpi: hosts for the servers (as -H's lines); the servers run only there, the workers "
                        "on the hosts of -H")
    p.add_argument("--launcher", choices=LAUNCHERS,
                   help="how to start processes (default: ssh with -H, else local)")
    p.add_argument("--sync-dst-dir", help="ssh: rsync the working directory to DIR on every host, run there")
    p.add_argument("--env", action="append", default=[], metavar="NAME:VALUE",
                   help="set NAME for every process (repeatable; a bare NAME forwards the launcher's value)")
    p.add_argument("--env-server", action="append", default=[], metavar="NAME:VALUE", help="same, servers only")
    p.add_argument("--env-worker", action="append", default=[], metavar="NAME:VALUE", help="same, workers only")
    p.add_argument("--log-dir", help="also write each process's output to DIR/<role>-<rank>.log")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands that would run (kubernetes: the manifests); start nothing")
    p.add_argument("--timeout", type=float, help="stop the job (exit 124) after this many seconds")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v: commands, scheduler)")
    p.add_argument("--host-ip", help="address the scheduler binds and everyone connects to (default: auto)")
    p.add_argument("--slurm-server-nodes", type=int, help="slurm: srun -N for the servers")
    p.add_argument("--slurm-worker-nodes", type=int, help="slurm: srun -N for the workers")
    p.add_argument("--sge-queue", help="sge: qsub -q QUEUE")
    p.add_argument("--yarn-queue", help="yarn: -queue QUEUE")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="start a failed server or worker again, up to N times for the whole job; servers "
                        "recover their state from a replica and the job goes on (local and ssh launchers; "
                        "kubernetes: N per pod; docs/reliability.md)")
    p.add_argument("--dashboard", metavar="[HOST:]PORT",
                   help="serve a live dashboard of the job at http://HOST:PORT/ (HOST default 127.0.0.1; "
                        "port 0: any free one; the URL is printed): the nodes, rates, stalls and events in a "
                        "browser, /metrics for Prometheus (docs/dashboard.md)")
    k = p.add_argument_group("kubernetes", "--launcher kubernetes (docs/kubernetes.md)")
    k.add_argument("--image", help="container image every pod runs (ps installed in it)")
    k.add_argument("--server-image", help="image of the servers and the scheduler (default: --image)")
    k.add_argument("--worker-image", help="image of the workers (default: --image)")
    k.add_argument("--namespace", help="namespace of the job (default: the kubectl context's)")
    k.add_argument("--job-name", help="name of the job's objects (default: ps-<script>-<5 random>)")
    for role in ("server", "worker", "scheduler"):
        k.add_argument(f"--{role}-resources", metavar="SPEC",
                       help=f"{role} pods request and are limited to SPEC, e.g. cpu=2,memory=4Gi,nvidia.com/gpu=1")
    k.add_argument("--detach", action="store_true", help="submit, print how to follow and delete the job, exit")
    k.add_argument("--kube-version", metavar="X.Y",
                   help="--dry-run: the manifests for this Kubernetes version (default: the newest)")
    p.add_argument("--no-auth", action="store_true",
                   help="no per-job signing key: servers then run no pickled MXNet optimizer (default: a job "
                        "on this machine gets a fresh key in PS_JOB_KEY_FILE; docs/security.md)")
    p.add_argument("--mode", choices=("ps", "mpi"), default="ps",
                   help="mpi: no server processes, every worker holds one server shard (MXNet's dist_sync_mpi; "
                        "any dist_* kvstore the script asks for runs so)")
    p.add_argument("--p3", action="store_true", help=argparse.SUPPRESS)  # MXNet's P3 van: not in ps
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command and its arguments")
    return p


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str],
               python: str = sys.executable) -> LaunchSpec:
    """Command line -> LaunchSpec. Raises SpecError (or HostfileError) naming the bad option."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if unknown:  # MXNet: unknown options are the program's, appended in order
        logger.warning("passing option(s) %s given before the command to the command", " ".join(unknown))
        command += unknown
    if not command:
        raise SpecError("no command given: e.g. python -m ps.launch -n 2 python train.py")
    if args.num_workers < 1:
        raise SpecError(f"-n/--num-workers must be >= 1, got {args.num_workers}")
    num_servers = args.num_workers if args.num_servers is None else args.num_servers
    if args.mode == "mpi" and args.num_servers is not None:
        raise SpecError(f"-s {args.num_servers} with --mode mpi: in mpi mode every worker holds one server shard "
                        "and no server process is started; drop -s (or use --mode ps)")
    if args.mode == "mpi" and args.slurm_server_nodes is not None:
        raise SpecError("--slurm-server-nodes with --mode mpi: there are no server processes to place")
    if num_servers < 1:
        raise SpecError(f"-s/--num-servers must be >= 1, got {num_servers}")
    launcher = args.launcher or ("ssh" if args.hostfile else "local")
    hosts = tuple(read_hostfile(args.hostfile)) if args.hostfile else ()
    if args.server_hosts:
        if not hosts:
            raise SpecError(f"--server-hosts {args.server_hosts} needs -H/--hostfile: the workers' hosts")
        marked = read_hostfile(args.server_hosts)
        for host in marked:
            if host.role == "worker":
                raise SpecError(f"--server-hosts {args.server_hosts}: {host.name} is marked role=worker")
        hosts += tuple(replace(h, role="server") for h in marked)
    if args.mode == "mpi" and any(h.role == "server" for h in hosts):
        raise SpecError("--server-hosts (or a role=server host) with --mode mpi: there are no server processes "
                        "to place; every worker holds its own shard")
    if hosts:
        check_roles(hosts, 0 if args.mode == "mpi" else num_servers, args.hostfile)
    if launcher == "ssh" and not hosts:
        raise SpecError("--launcher ssh needs -H/--hostfile")
    if hosts and launcher not in ("ssh", "mpi"):
        raise SpecError(f"-H/--hostfile is for --launcher ssh or mpi, not {launcher}")
    if args.sync_dst_dir and launcher != "ssh":
        raise SpecError("--sync-dst-dir only works with --launcher ssh")
    if args.timeout is not None and args.timeout <= 0:
        raise SpecError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.max_restarts < 0:
        raise SpecError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.max_restarts and launcher not in ("local", "ssh", "kubernetes"):
        raise SpecError(f"--max-restarts needs a launcher that starts each process itself (local or ssh); "
                        f"--launcher {launcher} starts them as one job of the cluster manager (kubernetes "
                        "restarts each pod)")
    kube_given = [f"--{o.replace('_', '-')}" for o in kubernetes.KUBE_ONLY if getattr(args, o) not in (None, False)]
    if kube_given and launcher != "kubernetes":
        raise SpecError(f"{', '.join(kube_given)}: for --launcher kubernetes only (not {launcher})")
    kube = kubernetes.options(args, command, environ) if launcher == "kubernetes" else None
    if args.p3:
        logger.warning("--p3 (MXNet's P3 van) is not supported by ps; ignored")
    if args.dashboard is not None:
        try:
            value_of("PS_DASHBOARD", {"PS_DASHBOARD": args.dashboard})
        except ConfigError as exc:
            raise SpecError(f"--dashboard: {exc}") from None
    env = tuple(parse_env_pair(e, environ, "--env") for e in args.env)
    if args.dashboard is not None and launcher == "kubernetes":     # the scheduler's pod reads it
        env += (("PS_DASHBOARD", args.dashboard),)
    spec = LaunchSpec(
        num_workers=args.num_workers, num_servers=num_servers, command=tuple(command),
        launcher=launcher, hosts=hosts, hostfile=args.hostfile,
        env=env,
        env_server=tuple(parse_env_pair(e, environ, "--env-server") for e in args.env_server),
        env_worker=tuple(parse_env_pair(e, environ, "--env-worker") for e in args.env_worker),
        sync_dst_dir=args.sync_dst_dir, log_dir=args.log_dir, dry_run=args.dry_run,
        timeout=args.timeout, verbose=args.verbose, host_ip=args.host_ip,
        server_command=default_server_command(command, python),
        slurm_server_nodes=args.slurm_server_nodes, slurm_worker_nodes=args.slurm_worker_nodes,
        sge_queue=args.sge_queue, yarn_queue=args.yarn_queue, auth=not args.no_auth,
        max_restarts=args.max_restarts, kube=kube, dashboard=args.dashboard, mode=args.mode)
    if kube is not None:
        kubernetes.check_env(spec)
    return spec


@contextlib.contextmanager
def _logging(output: Output, spec: LaunchSpec, environ: Mapping[str, str]) -> Iterator[None]:
    """Launcher records as [launcher] lines, the in-process scheduler's ("ps") as [scheduler]."""
    ours = OutputHandler(output, "launcher")
    ours.setFormatter(logging.Formatter("%(message)s"))
    sched = OutputHandler(output, "scheduler")
    sched.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    verbose_ps = spec.verbose > 0 or environ.get("PS_VERBOSE", "0") not in ("", "0")
    saved = []
    for name, handler, level in (("launcher", ours, logging.DEBUG if spec.verbose else logging.INFO),
                                 ("ps", sched, logging.INFO if verbose_ps else logging.WARNING)):
        log = logging.getLogger(name)
        saved.append((log, handler, log.level, log.propagate))
        log.addHandler(handler)
        log.propagate = False
        if log.level == logging.NOTSET or log.level > level:
            log.setLevel(level)
    try:
        yield
    finally:
        for log, handler, level, propagate in saved:
            log.removeHandler(handler)
            log.setLevel(level)
            log.propagate = propagate


def render(cmd: Command, base_env: Mapping[str, str]) -> str:
    """A Command as one shell line: ``env [-u NAME] K=V ... argv`` for what differs from ``base_env``."""
    env = cmd.env if cmd.env is not None else base_env
    unset = [a for k in base_env if k not in env for a in ("-u", k)]
    extra = [f"{k}={v}" for k, v in env.items() if base_env.get(k) != v]
    prefix = ["env", *unset, *extra] if unset or extra else []
    return shlex.join(prefix + list(cmd.argv))


def _summary(spec: LaunchSpec, backend: Backend, ip: str, port: Any) -> str:
    hosts = backend.host_count(spec)
    where = f"on {hosts} host{'s' if hosts != 1 else ''}" if hosts else f"via {spec.launcher}"
    if spec.joint:
        return (f"{spec.num_workers} joint worker{'s' if spec.num_workers != 1 else ''} (each holding a server "
                f"shard) {where}; scheduler {ip}:{port}")
    return (f"{spec.num_servers} server{'s' if spec.num_servers != 1 else ''}, "
            f"{spec.num_workers} worker{'s' if spec.num_workers != 1 else ''} {where}; scheduler {ip}:{port}")


def run(spec: LaunchSpec, environ: Mapping[str, str] | None = None, *, stop: StopSignal | None = None,
        scheduler_factory: Callable[[Mapping[str, str]], Any] | None = None,
        output: Output | None = None, owns_descendants: bool = False) -> int:
    """Run the job described by ``spec``; return its exit status."""
    environ = dict(os.environ if environ is None else environ)
    own_output = output is None
    output = output or Output(spec.log_dir)
    try:
        with _logging(output, spec, environ):
            return _run(spec, environ, output, stop, scheduler_factory, owns_descendants)
    finally:
        if own_output:
            output.close()


def _dry_run(spec: LaunchSpec, backend: Backend, ip: str, environ: Mapping[str, str], output: Output) -> int:
    output.raw(f"# {_summary(spec, backend, ip, '<port>')} (port chosen at start)")
    for cmd in backend.commands(spec, job_env(spec, ip, "<port>", environ), environ, True):
        output.raw(f"[{cmd.name}] {render(cmd, environ)}")
    for line in backend.describe(spec):
        output.raw(line)
    return 0


def _run(spec: LaunchSpec, environ: dict[str, str], output: Output, stop: StopSignal | None,
         scheduler_factory: Callable[[Mapping[str, str]], Any] | None, owns_descendants: bool) -> int:
    whole = BACKENDS[spec.launcher].run
    if whole is not None:           # the backend runs the job, scheduler and keys included
        return whole(spec, environ, output, stop)
    if spec.dry_run:
        return _start(spec, environ, output, stop, scheduler_factory, owns_descendants)
    with job_secret(spec, environ, spec.auth) as secret:
        if secret is not None:
            environ = {**environ, "PS_JOB_KEY_FILE": secret}
            spec = replace(spec, job_key=secret)
        return _start(spec, environ, output, stop, scheduler_factory, owns_descendants)


def _start(spec: LaunchSpec, environ: dict[str, str], output: Output, stop: StopSignal | None,
           scheduler_factory: Callable[[Mapping[str, str]], Any] | None, owns_descendants: bool) -> int:
    backend = BACKENDS[spec.launcher]
    try:
        ip = scheduler_ip(spec, environ)
        if spec.dry_run:
            return _dry_run(spec, backend, ip, environ, output)
        backend.prepare(spec, environ)
        runner = SchedulerRunner.start(scheduler_env(spec, ip, environ), scheduler_factory)
    except Exception as exc:  # bad host IP, rsync failed, scheduler could not bind...
        logger.error("%s", exc)
        return 1
    logger.info("%s", _summary(spec, backend, ip, runner.port))
    dashboard = getattr(runner.sched, "dashboard", None)    # a custom factory's may have none
    if dashboard is not None:
        logger.info("dashboard: %s (the job's nodes, rates, stalls and events, live; /metrics for "
                       "Prometheus)", dashboard.url)
    job = Job(output, owns_descendants=owns_descendants)
    env = job_env(spec, ip, runner.port, environ)
    try:
        cmds = backend.commands(spec, env, environ, False)
        for cmd in cmds:
            logger.debug("[%s] %s", cmd.name, render(cmd, environ))
        backend.start(spec, job, cmds)
    except Exception as exc:  # mpirun not found, a script could not be written...
        logger.error("could not start the job: %s", exc)
        job.stop()
        runner.close()
        job.close()
        return 1
    relocate = backend.relocation(spec, env, environ) if backend.relocation and spec.max_restarts else None
    return supervise(job, runner, stop, spec.timeout, restarts=Restarts(spec.max_restarts, relocate))


def main(argv: Sequence[str] | None = None, *, owns_process: bool = True) -> int:
    """CLI entry point. ``owns_process``: this process exists for the job (subreaper, signals)."""
    try:
        spec = parse_args(argv, os.environ)
    except (SpecError, HostfileError, OSError) as exc:
        sys.stderr.write(f"ps.launch: error: {exc}\n")
        return 2
    if not owns_process or spec.dry_run:
        return run(spec)
    become_subreaper()
    stop = StopSignal()
    restore = stop.install()
    try:
        return run(spec, stop=stop, owns_descendants=True)
    finally:
        restore()


if __name__ == "__main__":
    raise SystemExit(main())
