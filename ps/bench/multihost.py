"""The multi-host benchmark: ps and MXNet's native ps-lite on K network-namespace hosts with
shaped links, a real model's parameter list, compute simulated layer by layer.

    python -m ps.bench --hosts 4 --link 1gbit --model resnet50_v1 --compute 1.0
    python -m ps.bench --hosts 2,3,4 --link 1gbit --plot scaling.png     # efficiency against K

Each host runs one worker and one server (host 0, unshaped, runs the scheduler); with
``--server-hosts M``, M more hosts run the servers and the K hosts only workers. A step:
the forward pass (1/3 of ``--compute``) walks the keys in order and waits for each key's
new weights before its share; the backward pass (2/3) walks them in reverse and issues each
key's pushpull the moment its share ends (``priority=-index``, as MXNet's Trainer does).
Compute is ``time.sleep``: the CPUs stay free for the communication, as with a GPU. Reports
the median step time, the scaling efficiency (compute / step), bytes per host per step and
the bound max(compute, 2(K-1)/K x model / link); the CPU load of each run, to flag one that
was CPU-bound. Root only (namespaces, tc).

This module describes each job and runs and measures it; each host's worker is
ps/bench/kvstore_step.py (ps/bench/torch_step.py for the PyTorch jobs), and the tables, CSV
and chart are ps/bench/multihost_report.py.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from launcher.process import start_group, stop_group

from . import footprint, linkload
from .measure import load_between, machine_seconds
from .multihost_report import Run, read_csv, report_runs, write_csv
from .netns import Hosts, NamespaceError

MODELS = Path(__file__).with_name("models")
WIRE_PAYLOAD = 1448 / 1514      # TCP payload (MSS with timestamps) per Ethernet frame tbf counts
PORT = "9391"


def load_model(name: str) -> list[list[int]]:
    path = MODELS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"unknown --model {name!r}; have {', '.join(p.stem for p in MODELS.glob('*.json'))}")
    return json.loads(path.read_text())["shapes"]


def scaled(shapes: list[list[int]], factor: float) -> list[list[int]]:
    """Each tensor's first dimension times ``factor`` (at least 1): the model's layout and key
    count kept, its bytes about ``factor`` of them, so that a slower link and a smaller model
    keep the ratio of compute to communication while this machine's CPUs carry less."""
    return [[max(1, round(s[0] * factor)), *s[1:]] if s else s for s in shapes]


# byte thresholds measured against the model's tensors and the link's rate: --scale scales them
# with the model, so that a run at scale F on links F times as fast places, chunks and holds back
# the keys as the full model would be on the full link. Unscaled, MXNet's bigarray bound
# (1M elements) splits none of ResNet-50's tensors at 0.05 of their bytes: every key then lives
# on one server, all K workers push it to that server's port at once, and ps and native alike
# lose a third of their speed at K = 8. ps.torch's fusion size too: the tensors it fuses at F
# are those it fuses in the full model.
SCALED = ("MXNET_KVSTORE_BIGARRAY_BOUND", "PS_SEND_WINDOW", "PS_SEND_LOWAT", "PS_TORCH_FUSION", "PS_CHUNK_BYTES")


def scaled_env(factor: float) -> dict[str, str]:
    """The defaults of :data:`SCALED` times ``factor`` (nothing at 1; nothing for one that is
    off, 0); explicit settings win. DDP's bucket scales alike (``bucket_mb``): unscaled, a
    1 MiB chunk on a link ten times slower holds an urgent key back ten times longer than on
    the full link. The chunk size is one ps takes: at least CHUNK_MIN, in whole 8-byte words."""
    if factor >= 1:
        return {}
    from ..config import CHUNK_MIN, VARIABLES, whole_words
    defaults = {v.name: v.default for v in VARIABLES}
    scaled = {name: max(1, round(defaults[name] * factor)) for name in SCALED if defaults[name]}
    if "PS_CHUNK_BYTES" in scaled:
        scaled["PS_CHUNK_BYTES"] = whole_words(max(CHUNK_MIN, scaled["PS_CHUNK_BYTES"]))
    return {name: str(value) for name, value in scaled.items()}


def _sent_by_key(sizes: list[int], hosts: int, servers: int, bigarray_bound: int, server_hosts: int = 0):
    """After each key (in order), the bytes every host has sent for keys 0..k: its worker's
    pushes to servers on other hosts and its servers' replies to the other hosts' workers,
    keys placed by MXNet's rule on ``servers`` servers (server i on host i mod K). With
    ``server_hosts`` M, the servers are on M hosts of their own (server i on the (i mod M)th):
    a worker host sends each piece once, a server host each of its pieces to all K workers."""
    from ..keys import plan
    sent = [0.0] * (hosts + server_hosts)
    for key, n in enumerate(sizes):
        for piece in plan(key, n, servers, bigarray_bound):
            if server_hosts:
                for h in range(hosts):
                    sent[h] += 4 * piece.size
                sent[hosts + piece.server % server_hosts] += 4 * piece.size * hosts
                continue
            for h in range(hosts):
                if piece.server % hosts == h:
                    sent[h] += 4 * piece.size * (hosts - 1)     # its server answers the other workers
                else:
                    sent[h] += 4 * piece.size                   # its worker pushes to that server
        yield sent


def simple_bound(shapes: list, hosts: int, compute: float, link: float | None, servers: int = 0,
                 bigarray_bound: int = 1_000_000, server_hosts: int = 0) -> float:
    """max(compute, the busiest host's bytes per step / link): 2(K-1)/K x model / link with
    one server per host; the model / link with as many server hosts as worker hosts."""
    if not link:
        return compute
    *_, sent = _sent_by_key([_size(s) for s in shapes], hosts, servers or hosts, bigarray_bound, server_hosts)
    return max(compute, max(sent) / link)


def tight_bound(shapes: list, hosts: int, compute: float, link: float | None, servers: int = 0,
                bigarray_bound: int = 1_000_000, server_hosts: int = 0) -> float:
    """The issue's tight bound on a step: for every host h and key k, keys 0..k cannot leave
    before key k's gradient is ready and must all be back before key k's next forward:
    step >= C x (1 - a_k) + T_h(0..k) / link, a_k the fraction of the model's bytes before
    key k, T_h the bytes host h sends for them (``_sent_by_key``). The link carries TCP/IP
    frames: 1448 payload bytes per 1514 that tbf counts."""
    if not link:
        return compute
    link *= WIRE_PAYLOAD
    sizes = [_size(s) for s in shapes]
    total, before, best = sum(sizes), 0, compute
    for n, sent in zip(sizes, _sent_by_key(sizes, hosts, servers or hosts, bigarray_bound, server_hosts)):
        best = max(best, compute * (1 - before / total) + max(sent) / link)
        before += n
    return best


TORCH = ("ps-torch", "ps-torch-cross", "ddp")      # the PyTorch jobs (ps/bench/torch_step.py)


class Impl(NamedTuple):
    kind: str                   # "ps", "native", or one of TORCH
    env: dict[str, str]         # the variables that make the variant
    compression: str = ""       # ps: set_gradient_compression type ("fp16": both ways)
    joint: bool = False         # ps: no server processes, each worker holds a shard (DMLC_ROLE=joint)


def impl_env(impl: str) -> Impl:
    """``native``, ``ps``, ``ps-restarts`` (PS_MAX_RESTARTS=1: replication on), ``ps-fifo``
    (PS_SEND_WINDOW=0: call order), ``ps-fp16`` (fp16 compression: pushes and pulls halved),
    ``ps-joint`` (joint workers: each holds one server shard, no server processes),
    ``ps-torch`` (ps.torch's DistributedOptimizer), ``ps-torch-cross`` (the same with
    ``model=``: each module's forward waits for its own sums), ``ddp`` (PyTorch DDP over gloo, no
    servers), or ``ps:NAME=VALUE[:NAME=VALUE...]`` (also ``ps-torch:...``, ``ps-torch-cross:...``):
    which system, and what makes the variant."""
    if impl in ("native", *TORCH):
        return Impl(impl, {})
    if impl == "ps-restarts":
        return Impl("ps", {"PS_MAX_RESTARTS": "1"})
    if impl == "ps-fifo":
        return Impl("ps", {"PS_SEND_WINDOW": "0"})
    if impl == "ps-fp16":
        return Impl("ps", {}, "fp16")
    if impl == "ps-joint":
        return Impl("ps", {}, joint=True)
    kind, *pairs = impl.split(":")
    if kind not in ("ps", "ps-torch", "ps-torch-cross") or any("=" not in p for p in pairs):
        raise SystemExit(f"--impls: unknown implementation {impl!r}; use native, ps, ps-restarts, ps-fifo, "
                         "ps-fp16, ps-joint, ps-torch, ps-torch-cross, ddp or ps:NAME=VALUE[:NAME=VALUE] "
                         "(ps-torch and ps-torch-cross take NAME=VALUE too)")
    return Impl(kind, dict(p.split("=", 1) for p in pairs))


def link_bytes_per_s(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", rate.lower())
    if not m:
        raise SystemExit(f"--link {rate!r}: use tc's form, e.g. 1gbit, 100mbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    value = float(m.group(1)) * scale
    return value / 8 if m.group(3) == "bit" else value


def _worker(spec: dict) -> None:
    """A host's worker process (``--worker-mode``): one of PyTorch's jobs, or a kvstore's."""
    if spec["impl"] in TORCH:
        from .torch_step import run
    else:
        from .kvstore_step import run
    run(spec)


def num_servers(args: argparse.Namespace) -> int:
    """--servers, else one per server host, else one per host."""
    return args.servers or args.server_hosts or args.hosts


def server_host(args: argparse.Namespace, server: int) -> int:
    """Round robin over the server hosts (K+1..K+M), else over the worker hosts (1..K)."""
    if args.server_hosts:
        return args.hosts + 1 + server % args.server_hosts
    return 1 + server % args.hosts


def _env(hosts: Hosts, host: int, role: str, args: argparse.Namespace, rank: int | None = None,
         extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
    root = str(Path(__file__).resolve().parents[2])
    env.update(DMLC_ROLE=role, DMLC_PS_ROOT_URI=hosts.ip(0), DMLC_PS_ROOT_PORT=PORT,
               DMLC_NUM_SERVER=str(num_servers(args)), DMLC_NUM_WORKER=str(args.hosts),
               DMLC_NODE_HOST=hosts.ip(host),
               PYTHONPATH=root, PS_CONNECT_TIMEOUT="60", OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
               PS_MXNET_AUTOLOAD="0", PYTHONUNBUFFERED="1")
    if rank is not None:
        env["DMLC_RANK"] = str(rank)
    env.update(args.scaled_env)
    for pair in args.env:
        name, _, value = pair.partition("=")
        env[name] = value
    env.update(extra or {})
    return env


def run_once(hosts: Hosts, args: argparse.Namespace, impl: str, rep: int, shapes: list) -> Run:
    """One job of ``impl`` on ``hosts``; ``args.hosts`` is its K."""
    py = sys.executable
    kind, extra, compression, joint = impl_env(impl)
    node = [py, "-c", "import mxnet"] if kind == "native" else [py, "-m", "ps"]
    spec = {"impl": kind, "shapes": shapes, "compute": args.compute, "steps": args.steps, "warmup": args.warmup,
            "compression": compression, "bucket_mb": 25.0 * args.scale}    # DDP's default bucket, scaled
    if kind == "ddp":                                    # no scheduler, no servers: gloo's ring
        extra = {**extra, "MASTER_ADDR": hosts.ip(1), "MASTER_PORT": PORT, "WORLD_SIZE": str(args.hosts),
                 "GLOO_SOCKET_IFNAME": "eth0"}
    procs = [] if kind == "ddp" else [start_group(hosts.argv(0, node), _env(hosts, 0, "scheduler", args, None, extra),
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    workers = []
    counters: dict[str, list] = {}
    results: list[dict] = []
    trace = tempfile.NamedTemporaryFile(prefix="ps-linkload-", suffix=".json", delete=False).name
    sampler = start_group(hosts.switch_argv([py, "-m", "ps.bench.linkload", trace,
                                             *(f"p{h}" for h in range(1, args.hosts + args.server_hosts + 1))]),
                          {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.link else None
    finished = threading.Event()        # the workers are done (or failed): the process watch stops
    try:
        for i in range(0 if kind == "ddp" or joint else num_servers(args)):
            h = server_host(args, i)
            procs.append(start_group(hosts.argv(h, node), _env(hosts, h, "server", args, i, extra),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for h in range(1, args.hosts + 1):
            p = start_group(hosts.argv(h, [py, "-m", "ps.bench.multihost", "--worker-mode", json.dumps(spec)]),
                            _env(hosts, h, "joint" if joint else "worker", args, h - 1, {**extra, "RANK": str(h - 1)} if kind == "ddp"
                                 else extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
            workers.append(p)
            procs.append(p)
        timed = threading.Event()
        scheduler = None if kind == "ddp" else procs[0]
        launched = time.time()

        def watch(p: subprocess.Popen, out: list) -> None:
            for line in p.stdout:
                if line.startswith("TIMED") and not timed.is_set():
                    counters["start"] = [hosts.link_bytes(h) for h in range(1, args.hosts + 1)]
                    counters["cpu0"] = machine_seconds()
                    counters["sched0"] = [footprint.cpu_seconds(scheduler), time.monotonic()]
                    timed.set()
                out.append(line)
        outputs = [[] for _ in workers]
        readers = [threading.Thread(target=watch, args=(p, o), daemon=True) for p, o in zip(workers, outputs)]
        for t in readers:
            t.start()
        watcher = threading.Thread(target=lambda: counters.setdefault("procs", footprint.watch(procs, finished)),
                                   daemon=True)
        watcher.start()
        deadline = time.time() + args.timeout
        for p in workers:
            p.wait(max(1, deadline - time.time()))
        finished.set()
        watcher.join(5)
        counters["end"] = [hosts.link_bytes(h) for h in range(1, args.hosts + 1)]
        cpu1 = machine_seconds()
        sched1 = [footprint.cpu_seconds(scheduler), time.monotonic()]
        for t in readers:
            t.join(5)
        for p, out in zip(workers, outputs):
            res = [json.loads(ln[len("RESULT "):]) for ln in out if ln.startswith("RESULT ")]
            if p.returncode or not res:
                raise RuntimeError(f"{impl} worker failed ({p.returncode}): {''.join(out)[-2000:]}\n"
                                   f"{p.stderr.read()[-3000:]}")
            results.append(res[0])
    finally:
        finished.set()
        for p in [*procs, *([sampler] if sampler else [])]:
            try:
                stop_group(p, grace=2.0)
            except RuntimeError:
                pass
        link = link_bytes_per_s(args.link) if args.link else None
        windows = [r["window"] for r in results] if len(results) == len(workers) else []
        load_of_links = _link_load(trace, link, min((w[0] for w in windows), default=None),
                                   max((w[1] for w in windows), default=None), args.steps)
    load = load_between(counters["cpu0"], cpu1)
    step = statistics.median(r["median"] for r in results)
    total_steps = args.steps
    moved = [(e[0] - s[0]) + (e[1] - s[1]) for s, e in zip(counters["start"], counters["end"])]
    k = args.hosts
    bigarray = int(_env(hosts, 0, "scheduler", args, None, extra).get("MXNET_KVSTORE_BIGARRAY_BOUND", 1_000_000))
    bound = simple_bound(shapes, k, args.compute, link, num_servers(args), bigarray, args.server_hosts)
    sched0 = counters.get("sched0", [0.0, 0.0])
    sample = counters.get("procs", footprint.ProcessSample(0.0, 0.0, 0.0))
    return Run(impl, rep, k, step, args.compute, bound, args.compute / step,
               statistics.median(moved) / total_steps / 1e6, load,
               tight_bound(shapes, k, args.compute, link, num_servers(args), bigarray, args.server_hosts),
               num_servers(args),
               statistics.median(r["stall"] for r in results), statistics.median(r["first_stall"] for r in results),
               *load_of_links,
               form_s=max(r.get("formed", 0.0) for r in results) - max(r.get("calling", 0.0) for r in results),
               start_s=max(r.get("formed", launched) for r in results) - launched,
               rss_mb=sample.rss_mb, conns=sample.conns, threads=sample.threads,
               sched_cpu=(sched1[0] - sched0[0]) / max(1e-9, sched1[1] - sched0[1]), server_hosts=args.server_hosts)


def _link_load(trace: str, link: float | None, start: float | None, end: float | None,
               steps: int) -> linkload.LinkLoad:
    """The sampler's summary of the timed steps, then its file removed; zeros without a
    shaped link or if the sampler died (the run still counts)."""
    try:
        if link and start is not None and end is not None:
            return linkload.summarize(trace, link, start, end, steps)
    except (OSError, ValueError, KeyError) as exc:
        print(f"# no link load: {exc}", file=sys.stderr)
    finally:
        try:
            os.unlink(trace)
        except OSError:
            pass
    return linkload.LinkLoad(0.0, 0.0)


def _size(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ps.bench --hosts", description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="", help="K namespace hosts, one worker and one server each; a comma list "
                   "(2,3,4) runs each K in turn")
    p.add_argument("--servers", default="", help="servers in the job, placed round robin on the hosts (default: "
                   "one per host); a comma list (2,4,8) runs each in turn: the server:worker ratio")
    p.add_argument("--server-hosts", type=int, default=0, metavar="M",
                   help="M more hosts that run only the servers (one each unless --servers says); the K hosts then "
                   "run only workers. DDP's ring uses the K hosts")
    p.add_argument("--link", default="1gbit", help="tc rate of every host's link, both ways (e.g. 1gbit); 'none'")
    p.add_argument("--tcp", metavar="NAME", help="the hosts' TCP congestion control (cubic, bbr, reno; default: "
                   "this machine's, net.ipv4.tcp_congestion_control)")
    p.add_argument("--model", default="resnet50_v1", help="parameter shapes: resnet50_v1 or vgg16")
    p.add_argument("--scale", type=float, default=1.0,
                   help="each tensor's first dimension times this (0.1: a tenth of the model's bytes, its keys kept)")
    p.add_argument("--compute", type=float, default=1.0, help="simulated compute per step, seconds")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="alternating repetitions per implementation")
    p.add_argument("--impls", default="ps,native",
                   help="comma list of ps, native, ps-restarts (ps with PS_MAX_RESTARTS=1: replication on), "
                   "ps-fifo (PS_SEND_WINDOW=0: sent in call order), ps-fp16 (fp16 compression, both ways), "
                   "ps:NAME=VALUE[:NAME=VALUE] (any variant)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra env for every process")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny model, 0.05 s compute, 3 steps")
    p.add_argument("--csv", help="write one row per run")
    p.add_argument("--plot", metavar="FILE.png", help="draw scaling efficiency against K (ps, native, the bound)")
    p.add_argument("--from-csv", metavar="FILE", help="redraw the table and --plot from a CSV; run nothing")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--worker-mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_mode:
        _worker(json.loads(args.worker_mode))
        return 0
    if args.link == "none":
        args.link = None
    if not 0 < args.scale <= 1:
        p.error(f"--scale must be in (0, 1], got {args.scale}")
    shapes = scaled(load_model(args.model), args.scale)
    args.scaled_env = scaled_env(args.scale)
    if args.from_csv:
        report_runs(read_csv(args.from_csv), args, shapes)
        return 0
    try:
        counts = [int(k) for k in str(args.hosts).split(",") if k]
    except ValueError:
        p.error(f"--hosts takes a number or a comma list of numbers, got {args.hosts!r}")
    if not counts or min(counts) < 1:
        p.error(f"--hosts must be >= 1, got {args.hosts!r}")
    try:
        server_counts = [int(n) for n in str(args.servers).split(",") if n] or [0]
    except ValueError:
        p.error(f"--servers takes a number or a comma list of numbers, got {args.servers!r}")
    if min(server_counts) < 0 or (args.servers and min(server_counts) < 1):
        p.error(f"--servers must be >= 1, got {args.servers!r}")
    if args.server_hosts < 0:
        p.error(f"--server-hosts must be >= 0, got {args.server_hosts}")
    if args.quick:
        shapes, args.compute, args.steps, args.warmup, args.reps = shapes[:12], 0.05, 3, 1, 1
    impls = [i for i in args.impls.split(",") if i]
    for impl in impls:
        impl_env(impl)                       # a bad name fails now, not after the first runs
    if any(impl_env(i).kind in TORCH for i in impls) and importlib.util.find_spec("torch") is None:
        raise SystemExit("--impls ps-torch and ddp need PyTorch: pip install -e '.[torch]'")
    if "native" in impls:
        try:
            import mxnet  # noqa: F401
        except ImportError:
            impls.remove("native")
            print("# mxnet is not installed: native left out", file=sys.stderr)
    runs: list[Run] = []
    try:
        for k in counts:
            args.hosts = k
            with Hosts(k + args.server_hosts, args.link, tcp=args.tcp) as hosts:
                args.tcp = hosts.tcp            # the report names it
                for rep in range(args.reps):
                    for n in server_counts:
                        args.servers = n
                        for impl in impls if rep % 2 == 0 else impls[::-1]:
                            if impl_env(impl).joint and (n not in (0, k) or args.server_hosts):
                                continue            # joint: one shard per worker host, no server hosts
                            run = run_once(hosts, args, impl, rep, shapes)
                            runs.append(run)
                            print(f"# K={k}{f'+{args.server_hosts}' if args.server_hosts else ''} S={run.servers} {impl} rep {rep}: step {run.step_s:.3f}s  efficiency "
                                  f"{run.efficiency:.2f}  {run.mb_per_host_step:.1f} MB/host/step  forward waits "
                                  f"{run.stall_s:.3f}s (first key {run.key0_stall_s:.3f}s)  links busy "
                                  f"{run.busy_util:.0%}, idle {run.idle_s:.3f}s/step  CPU load {run.cpu_load:.0%}  "
                                  f"formed in {run.form_s:.2f}s ({run.start_s:.1f}s from launch)  largest process: "
                                  f"{run.rss_mb:.0f} MB, {run.conns:.0f} TCP conns, {run.threads:.0f} threads  "
                                  f"scheduler CPU {run.sched_cpu:.1%}", flush=True)
    except NamespaceError as exc:
        print(f"ps.bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ps.bench: interrupted; its processes, namespace hosts and route were removed", file=sys.stderr)
        return 130
    if args.csv:
        write_csv(args.csv, runs)
    report_runs(runs, args, shapes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
