"""``python -m ps.bench``: ps against MXNet's native ps-lite on this machine, in one run.

    python -m ps.bench --vs-native -w 2 -s 2 --csv out.csv --plot out.png
    python -m ps.bench --quick --csv /tmp/smoke.csv            # CI smoke, < 60 s

For every W x S configuration it starts a real job on 127.0.0.1 (scheduler, servers,
workers, ``DMLC_*`` variables) for ps and, with ``--vs-native``, one for MXNet; both stay
up while the cases run, and the repetitions of each case alternate between them (the
order flips every repetition) so that the machine's load hits both alike. A round is a
non-blocking pushpull of every key of the case, then one wait. Reported: per-case
medians over repetitions, the ratio native/ps, throughput, and the ps servers' RSS
against what they store. Timing numbers are benchmarks: nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import signal
import sys
import time
from typing import Any

import psutil

from ps.netutil import listen_ports
from . import report
from .cluster import BenchError, Cluster
from .measure import CpuWindow, RoleCpu, proc_status, settle
from .report import Row, parse_size, size_label

ALIASES = {"many-keys": "200x16K", "8x2MB": "8x2M", "64MB": "1x64M"}
DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M"
DEFAULT_CASES = "sizes,many-keys,8x2MB"
ROUND_BUDGET = 512 << 20     # auto rounds: about this many bytes per worker per repetition


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ps.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-w", "--workers", action="append", help="worker counts, e.g. 1,2,4 (default 2)")
    p.add_argument("-s", "--servers", action="append", help="server counts, e.g. 1,2 (default 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"value sizes of the one-key cases ({DEFAULT_SIZES})")
    p.add_argument("--cases", default=DEFAULT_CASES,
                   help="comma list: sizes, many-keys (200x16K), 8x2MB, 64MB, or NxSIZE / SIZE "
                        f"(default {DEFAULT_CASES})")
    p.add_argument("--reps", type=int, default=3, help="repetitions per case and implementation (default 3)")
    p.add_argument("--rounds", type=int, default=0,
                   help="timed rounds per repetition (default: ~512 MB per worker, 10..400)")
    p.add_argument("--warmup", type=int, default=0, help="untimed rounds first (default rounds/10, >= 2)")
    p.add_argument("--vs-native", action="store_true", help="also run MXNet's own ps-lite and report ratios")
    p.add_argument("--ab", metavar="DIR",
                   help="A/B: also run ps from the checkout DIR (DIR/ps) as 'ps-b', alternating, and report "
                        "ps-b time / ps time")
    p.add_argument("--joint", action="store_true",
                   help="A/B: also run this ps with joint workers (DMLC_ROLE=joint: W server shards inside the "
                        "workers, no server processes) as 'ps-b', and report ps-b time / ps time")
    p.add_argument("--native-op", choices=("pushpull", "push-pull", "best"), default="best",
                   help="native round: kv.pushpull, push then pull, or both on the same rounds and keep the "
                        "faster median (default best, as issue #6 asks)")
    p.add_argument("--optimizer", choices=("none", "sgd", "momentum"), default="none",
                   help="optimizer on the servers (momentum keeps one state array per key)")
    p.add_argument("--gluon", action="store_true",
                   help="also time Gluon training steps (at W2 S2 if that is a config, else the first one)")
    p.add_argument("--gluon-only", action="store_true", help="only the Gluon benchmark")
    p.add_argument("--gluon-models", default="mlp,conv", help="mlp, conv (default both)")
    p.add_argument("--gluon-sync", choices=("loss", "all"), default="loss",
                   help="after each Gluon step wait for its loss (default; a training loop's metric) "
                        "or for everything (mx.nd.waitall(): no overlap across steps)")
    p.add_argument("--gluon-steps", type=int, default=20, help="timed Gluon steps per repetition (default 20)")
    p.add_argument("--csv", metavar="FILE", help="write every repetition and the medians here")
    p.add_argument("--plot", metavar="FILE.png", help="chart: throughput vs size, scaling vs workers, speedups")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--from-csv", metavar="FILE", help="run nothing: print the tables (and --plot) of an earlier --csv")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (CI): W2 S1, 3 small cases, 1 repetition")
    p.add_argument("--max-foreign", type=float, default=15.0,
                   help="before each repetition wait until other processes use < this %% CPU (default 15)")
    p.add_argument("--settle", type=float, default=3.0, help="... but at most this many seconds (default 3; 0 = off)")
    p.add_argument("--timeout", type=float, default=180.0, help="bound on start-up and on each repetition (s)")
    p.add_argument("--ps-env", action="append", default=[], metavar="NAME=VALUE", help="extra env for ps processes")
    p.add_argument("--native-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra env for native processes")
    p.add_argument("--ab-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra env for ps-b only (--ab . --ab-env PS_MAX_RESTARTS=1: a setting's cost in one run)")
    p.add_argument("--py-spy", metavar="DIR", help="record the ps servers with py-spy (speedscope files in DIR)")
    p.add_argument("--cprofile", metavar="DIR", help="cProfile the ps workers' timed rounds (files in DIR)")
    args = p.parse_args(argv)
    if args.quick:
        args.workers = args.workers or ["2"]
        args.servers = args.servers or ["1"]
        args.sizes, args.cases = "4K,1M", "sizes,20x16K"
        args.reps, args.rounds, args.warmup, args.settle = 1, args.rounds or 5, args.warmup or 1, 0
        args.gluon_models, args.gluon_steps = "conv", min(args.gluon_steps, 3)
    args.workers = _int_list(args.workers or ["2"], "--workers")
    args.servers = _int_list(args.servers or ["2"], "--servers")
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def _int_list(values: list[str], flag: str) -> list[int]:
    try:
        out = [int(x) for v in values for x in v.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag} takes integers like 1,2,4, got {values}") from None
    if not out or min(out) < 1:
        raise SystemExit(f"{flag} needs counts >= 1, got {values}")
    return sorted(set(out))


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def build_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """[{name, keys, elems, key_bytes, round_bytes, base, rounds, warmup}] in run order."""
    specs: list[tuple[int, int]] = []
    for item in [c.strip() for c in args.cases.split(",") if c.strip()]:
        if item == "sizes":
            specs += [(1, parse_size(s)) for s in args.sizes.split(",") if s.strip()]
            continue
        item = ALIASES.get(item, item)
        n, sep, size = item.partition("x")
        try:
            specs.append((int(n), parse_size(size)) if sep else (1, parse_size(item)))
        except ValueError as exc:
            raise SystemExit(f"--cases: {exc}") from None
    cases, base, seen = [], 0, set()
    for n, nbytes in specs:
        if (n, nbytes) in seen:
            continue
        seen.add((n, nbytes))
        round_bytes = n * nbytes
        rounds = args.rounds or max(10, min(400, ROUND_BUDGET // round_bytes))
        cases.append({"name": f"{n}x{size_label(nbytes)}", "keys": n, "elems": nbytes // 4, "key_bytes": nbytes,
                          "round_bytes": round_bytes, "base": base, "rounds": rounds,
                          "warmup": args.warmup or max(2, rounds // 10)})
        base += -(-n // 1000) * 1000      # keys of different cases never collide
    return cases


class Progress:
    """tqdm when installed, else one self-overwriting line on stderr."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, file=sys.stderr, unit="rep", dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        else:
            print(f"\r[{self.done}/{self.total}] {time.monotonic() - self.start:6.0f}s {label:<48}",
                  end="", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(f"\n{text}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


def measure(clusters: dict[str, Cluster], order: list[str], cmd: dict[str, Any], args: argparse.Namespace,
            all_pids: list[int]) -> dict[str, tuple[list[dict], float, float]]:
    out = {}
    for impl in order:
        if args.settle > 0:
            settle(all_pids, args.max_foreign, args.settle)
        win, roles = CpuWindow(all_pids), RoleCpu(clusters[impl])
        answers = clusters[impl].command(cmd, timeout=args.timeout)
        busy, foreign = win.close()
        rounds = max(1, int(answers[0].get("rounds_run", len(answers[0]["times_ms"]))))
        answers[0]["cpu_ms"] = {role: ms / rounds for role, ms in roles.per_process_ms().items()}
        out[impl] = (answers, busy, foreign)
    return out


def run_config(w: int, s: int, cases: list[dict], impls: list[str], args: argparse.Namespace,
               progress: Progress, rows: list[Row]) -> None:
    spec = {"mode": "kv", "cases": cases, "native_op": args.native_op,
            "optimizer": None if args.optimizer == "none" else args.optimizer}
    clusters = start_clusters(impls, w, s, spec, args)
    try:
        pids = [p for c in clusters.values() for p in c.pids]
        peak: dict[int, int] = {}
        for case in cases:
            cmd = {"op": "run", "case": case["name"], "rounds": case["rounds"], "warmup": case["warmup"]}
            if args.cprofile:
                cmd["profile"] = os.path.join(args.cprofile, f"W{w}S{s}-{case['name']}")
            for rep in range(args.reps):
                order = impls if rep % 2 == 0 else impls[::-1]
                for impl, (answers, busy, foreign) in measure(clusters, order, cmd, args, pids).items():
                    rows.append(report.rep_row(impl, w, s, case, rep, answers, busy, foreign))
                progress.step(f"W{w}S{s} {case['name']} rep {rep + 1}/{args.reps}")
            for c in clusters.values():   # RSS after the timed rounds of each case; the check keeps the largest
                for pid in c.server_pids:
                    peak[pid] = max(peak.get(pid, 0), proc_status(pid).get("VmRSS", 0))
        for c in clusters.values():
            stats = c.command({"op": "stats"}, ranks=[0])[0]["servers"] if c.kind == "ps" else {}
            rows += memory_rows(c, stats, peak, w, s, "all keys", args.optimizer == "momentum")
    except BaseException:
        _kill(clusters)
        raise
    _stop(clusters)


def memory_rows(cluster: Cluster, stats: dict[str, Any], peak: dict[int, int], w: int, s: int, case: str,
                with_state: bool, stored_total: int | None = None) -> list[Row]:
    """One row per server: RSS after the timed rounds against 1.25 x (values + state) + 64 MB."""
    by_port = {v["port"]: v["bytes"] for v in stats.values()}
    rows = []
    for i, pid in enumerate(cluster.server_pids):
        st = proc_status(pid)
        rss = max(peak.get(pid, 0), st.get("VmRSS", 0))
        try:
            ports = listen_ports(pid)
        except psutil.Error:         # gone, or hidden from us: no stored size by port
            ports = set()
        stored = next((by_port[p] for p in ports if p in by_port), None)
        if stored is None and stored_total is not None:
            stored = stored_total / len(cluster.server_pids)
        r = Row("memory", cluster.impl, w, s, case, rep=i, server_rss_mb=round(rss / 2**20, 1),
                server_hwm_mb=round(st.get("VmHWM", 0) / 2**20, 1))
        if stored is not None:
            need = stored * (2 if with_state else 1)
            limit = report.MEM_FACTOR * need + report.MEM_SLACK
            r.stored_mb, r.limit_mb, r.ok = round(need / 2**20, 2), round(limit / 2**20, 1), rss <= limit
        rows.append(r)
    return rows


def _stop(clusters: dict[str, Cluster]) -> None:
    """Clean end: workers close their stores, so servers and schedulers exit by themselves."""
    for c in clusters.values():
        c.stop()


def _kill(clusters: dict[str, Cluster]) -> None:
    for c in clusters.values():
        c.kill()


def start_clusters(impls: list[str], w: int, s: int, spec: dict[str, Any], args: argparse.Namespace,
                   ) -> dict[str, Cluster]:
    clusters: dict[str, Cluster] = {}
    try:
        for impl in impls:
            env = _env_pairs(args.native_env if impl == "native" else args.ps_env)
            if impl == "ps-b":
                if not args.joint:
                    env["PYTHONPATH"] = args.ab
                env.update(_env_pairs(args.ab_env))
            wrap = None
            if impl == "ps" and args.py_spy:
                os.makedirs(args.py_spy, exist_ok=True)
                py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
                wrap = [py_spy, "record", "--nonblocking", "-r", "250", "-f", "speedscope", "-o",
                        os.path.join(os.path.abspath(args.py_spy), f"W{w}S{s}-server{{i}}.json"), "--"]
            c = Cluster(impl, w, s, spec, env=env, timeout=args.timeout, wrap=wrap,
                        joint=impl == "ps-b" and args.joint)
            clusters[impl] = c      # registered first, so a failed start is still cleaned up
            c.start()
    except BaseException:
        _kill(clusters)
        raise
    return clusters


def run_gluon(w: int, s: int, args: argparse.Namespace, progress: Progress, rows: list[Row]) -> list[str]:
    from .gluon import MODELS, mxnet_missing
    missing = mxnet_missing()
    if missing:
        return [f"Gluon: SKIPPED - {missing}"]
    notes: list[str] = []
    impls = ["ps"]
    if args.vs_native:
        impls.append("native")
    if args.ab or args.joint:
        impls.append("ps-b")
    for model in [m.strip() for m in args.gluon_models.split(",") if m.strip()]:
        if model not in MODELS:
            raise SystemExit(f"--gluon-models: unknown model {model!r}; use {', '.join(MODELS)}")
        spec = {"mode": "gluon", "model": model}
        clusters = start_clusters(impls, w, s, spec, args)
        try:
            pids = [p for c in clusters.values() for p in c.pids]
            name = f"gluon-{model}" + ("-waitall" if args.gluon_sync == "all" else "")
            case = {"name": name, "keys": 0, "key_bytes": 0, "round_bytes": 0}
            cmd = {"op": "gluon", "steps": args.gluon_steps, "warmup": 3, "sync": args.gluon_sync}
            params = 0
            for rep in range(args.reps):
                order = impls if rep % 2 == 0 else impls[::-1]
                for impl, (answers, busy, foreign) in measure(clusters, order, cmd, args, pids).items():
                    rows.append(report.rep_row(impl, w, s, case, rep, answers, busy, foreign))
                    params = answers[0]["params"]
                progress.step(f"W{w}S{s} {name} rep {rep + 1}/{args.reps}")
            for c in clusters.values():   # SGD momentum: one state array per parameter
                stats = c.command({"op": "stats"}, ranks=[0])[0]["servers"] if c.kind == "ps" else {}
                rows += memory_rows(c, stats, {}, w, s, name, True,
                                    stored_total=params * 4 if c.kind == "ps" else None)
        except BaseException:
            _kill(clusters)
            raise
        _stop(clusters)
    return notes


def machine() -> str:
    import numpy
    import zmq
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mx = "not installed"
    if importlib.util.find_spec("mxnet") is not None:
        from importlib.metadata import version
        mx = version("mxnet")
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, numpy {numpy.__version__}, "
            f"pyzmq {zmq.__version__} / libzmq {zmq.zmq_version()}, mxnet {mx}; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt    # unwinds through the kill paths, like ^C


def report_only(args: argparse.Namespace) -> int:
    rows = report.read_csv(args.from_csv)
    print(report.table(rows, args.markdown))
    for extra in (report.cpu_table(rows, args.markdown), report.memory_table(rows, args.markdown)):
        if extra:
            print(f"\n{extra}")
    if args.plot:
        report.plot(rows, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_csv:
        return report_only(args)
    signal.signal(signal.SIGTERM, _sigterm)
    if (args.vs_native or args.gluon or args.gluon_only) and importlib.util.find_spec("mxnet") is None:
        if args.vs_native or args.gluon_only:
            print("ps.bench: --vs-native and the Gluon benchmark need mxnet 1.9.1 "
                  "(pip install 'mxnet==1.9.1' 'numpy<1.24')", file=sys.stderr)
            return 2
        args.gluon = False
    cases = [] if args.gluon_only else build_cases(args)
    impls = ["ps", "native"] if args.vs_native else ["ps"]
    if args.ab and args.joint:
        print("ps.bench: --ab and --joint both run as ps-b: give one", file=sys.stderr)
        return 2
    if args.joint:
        impls.append("ps-b")
    if args.ab:
        args.ab = os.path.abspath(args.ab)
        if not os.path.isfile(os.path.join(args.ab, "ps", "__init__.py")):
            print(f"ps.bench: --ab {args.ab}: no ps/__init__.py there", file=sys.stderr)
            return 2
        impls.append("ps-b")
    if args.cprofile:       # the workers write there, from their own working directory
        args.cprofile = os.path.abspath(args.cprofile)
        os.makedirs(args.cprofile, exist_ok=True)
    configs = [(w, s) for w in args.workers for s in args.servers]
    gluon = args.gluon or args.gluon_only
    gluon_configs = ([(2, 2)] if (2, 2) in configs else configs[:1]) if gluon else []
    n_gluon = len([m for m in args.gluon_models.split(",") if m.strip()]) * args.reps * len(gluon_configs)
    print(f"# ps.bench on {machine()}", flush=True)
    print(f"# configs {' '.join(f'W{w}S{s}' for w, s in configs)}; cases {' '.join(c['name'] for c in cases)}; "
          f"{args.reps} reps; {'ps vs native' if args.vs_native else 'ps only'}", flush=True)
    rows: list[Row] = []
    notes: list[str] = []
    progress = Progress(len(configs) * len(cases) * args.reps + n_gluon)
    started = time.monotonic()
    try:
        for w, s in configs:
            if cases:
                run_config(w, s, cases, impls, args, progress, rows)
            if (w, s) in gluon_configs:
                notes += run_gluon(w, s, args, progress, rows)
    except BenchError as exc:
        progress.close()
        print(f"ps.bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print("ps.bench: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    progress.close()
    rows += report.pair_and_summarize(rows)
    if args.csv:
        report.write_csv(args.csv, rows)
    print(report.table(rows, args.markdown))
    cpu = report.cpu_table(rows, args.markdown)
    if cpu:
        print("\n# CPU per round: ms of CPU time one worker / one server used per round (median over repetitions)")
        print(cpu)
    mem = report.memory_table(rows, args.markdown)
    if mem:
        print("\n# server memory: RSS after the timed rounds vs 1.25 x (stored values + optimizer state) + 64 MB")
        print(mem)
    for note in dict.fromkeys(notes):
        print(f"\n# {note}")
    if args.plot:
        report.plot(rows, args.plot)
    print(f"\n# done in {time.monotonic() - started:.0f}s" + (f"; CSV {args.csv}" if args.csv else "")
          + (f"; chart {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
