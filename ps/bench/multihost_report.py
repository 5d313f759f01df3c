"""The multi-host benchmark's results: one :class:`Run` per job, its CSV, the table per K
and server count, and the chart of scaling efficiency against K. Kept apart from the driver
so that ``--from-csv`` redraws all of it from a CSV without running anything.
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
from dataclasses import asdict, dataclass

from .measure import CPU_LIMIT


@dataclass
class Run:
    """One job of the benchmark, as measured: a row of the CSV."""

    impl: str
    rep: int
    hosts: int
    step_s: float
    compute_s: float
    bound_s: float
    efficiency: float
    mb_per_host_step: float
    cpu_load: float
    tight_s: float = 0.0        # multihost.tight_bound(); 0 in a CSV written before it existed
    servers: int = 0            # servers in the job (0 in an older CSV: one per host)
    stall_s: float = 0.0        # a worker's forward pass, waiting for weights (median step, median worker)
    key0_stall_s: float = 0.0   # of which waiting for the first key's (the last gradient backward made)
    busy_util: float = 0.0      # hosts' outgoing links, mean use while any carried traffic (linkload.py)
    idle_s: float = 0.0         # per step, seconds in which no host's link carried anything
    form_s: float = 0.0         # from the last worker's KVStore() call to the last one formed
    start_s: float = 0.0        # from the launch of the first process to the last worker formed
    rss_mb: float = 0.0         # the job's largest process, during the timed steps
    conns: float = 0.0          # ... most established TCP connections of one process
    threads: float = 0.0        # ... most threads of one process
    sched_cpu: float = 0.0      # the scheduler's CPU time per wall second over the timed steps
    server_hosts: int = 0       # hosts that ran only servers (--server-hosts), besides the K



FLOATS = ("step_s", "compute_s", "bound_s", "efficiency", "mb_per_host_step", "cpu_load", "tight_s", "stall_s",
          "key0_stall_s", "busy_util", "idle_s", "form_s", "start_s", "rss_mb", "conns", "threads", "sched_cpu")


def read_csv(path: str) -> list[Run]:
    """The runs of a CSV :func:`write_csv` wrote, older ones too (their missing columns 0)."""
    with open(path, newline="") as fh:
        return [Run(r["impl"], int(r["rep"]), int(r["hosts"]), *(float(r.get(f) or 0) for f in FLOATS[:7]),
                    servers=int(r.get("servers") or r["hosts"]), server_hosts=int(r.get("server_hosts") or 0),
                    **{f: float(r.get(f) or 0) for f in FLOATS[7:]})
                for r in csv.DictReader(fh)]


def write_csv(path: str, runs: list[Run]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(asdict(runs[0])))
        w.writeheader()
        for run in runs:
            w.writerow(asdict(run))


def report_runs(runs: list[Run], args: argparse.Namespace, shapes: list) -> None:
    """A table for each K and server count (``args.hosts`` set to each K in turn), then the
    ``--plot`` chart."""
    for k, m, n in sorted({(r.hosts, r.server_hosts, r.servers) for r in runs}):
        args.hosts = k
        report([r for r in runs if (r.hosts, r.server_hosts, r.servers) == (k, m, n)], args, shapes)
    if args.plot:
        plot(runs, args, args.plot)


def plot(runs: list[Run], args: argparse.Namespace, path: str) -> None:
    """Scaling efficiency (compute / step) against K: ps, native and the bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.8))
    counts = sorted({r.hosts for r in runs})
    styles = {"ps": ("tab:blue", "o-"), "native": ("tab:orange", "s-"), "ps-restarts": ("tab:gray", "^--"),
              "ps-joint": ("tab:green", "D-")}
    valid = [r for r in runs if r.cpu_load <= CPU_LIMIT]      # the others measured the machine: left out
    for impl in dict.fromkeys(r.impl for r in runs):
        color, style = styles.get(impl, ("tab:purple", "x-"))
        pts = [(k, statistics.median(r.efficiency for r in valid if r.impl == impl and r.hosts == k))
               for k in counts if any(r.impl == impl and r.hosts == k for r in valid)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=impl)
    bound = [(k, min(r.compute_s / r.bound_s for r in runs if r.hosts == k)) for k in counts]
    ax.plot([p[0] for p in bound], [p[1] for p in bound], "k:", label="bound: compute / max(compute, comm)")
    tight = [(k, min(r.compute_s / r.tight_s for r in runs if r.hosts == k)) for k in counts
             if all(r.tight_s for r in runs if r.hosts == k)]
    if tight:                   # a CSV written before the tight bound existed has none
        ax.plot([p[0] for p in tight], [p[1] for p in tight], "k--",
                label="tight bound: gradients ready layer by layer, needed in order")
    ax.set_xticks(counts)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("hosts (one worker and one server each; runs above "
                  f"{CPU_LIMIT:.0%} CPU left out)")
    ax.set_ylabel("scaling efficiency (compute / step)")
    scale = getattr(args, "scale", 1.0)
    model = args.model + (f" with {scale:g} of its bytes" if scale != 1.0 else "")
    ax.set_title(f"{model}, {args.link or 'unshaped'} links both ways, {runs[0].compute_s:g} s compute per step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# chart: {path}")


def report(runs: list[Run], args: argparse.Namespace, shapes: list) -> None:
    model_mb = sum(math.prod(s) for s in shapes) * 4 / 1e6
    reps = len({r.rep for r in runs})
    where = f" on {runs[0].server_hosts} server-only hosts" if runs[0].server_hosts else ""
    tcp = f", TCP {args.tcp}" if getattr(args, "tcp", None) else ""
    print(f"\n# {args.hosts} hosts, {runs[0].servers} servers{where}, link {args.link or 'unshaped'} both ways{tcp}, "
          f"{args.model}"
          f"{' x%g' % args.scale if getattr(args, 'scale', 1.0) != 1.0 else ''} "
          f"({len(shapes)} keys, {model_mb:.1f} MB), compute {runs[0].compute_s:g}s, median of {reps} reps")
    if getattr(args, "scaled_env", None):
        print("# scaled with the model: " + ", ".join(f"{k}={v}" for k, v in args.scaled_env.items()))
    width = max(11, *(len(r.impl) for r in runs))
    print(f"{'impl':{width}} {'step s':>8} {'bound s':>8} {'step/bound':>10} {'tight s':>8} {'step/tight':>10} "
          f"{'efficiency':>10} {'MB/host/step':>12} {'fwd wait s':>10} {'key 0 s':>8} {'links busy':>10} "
          f"{'idle s':>6} {'CPU load':>8}  per-rep step s")
    for impl in dict.fromkeys(r.impl for r in runs):
        mine = [r for r in runs if r.impl == impl]
        step = statistics.median(r.step_s for r in mine)
        bound, tight = mine[0].bound_s, mine[0].tight_s
        print(f"{impl:{width}} {step:8.3f} {bound:8.3f} {step / bound:10.2f} {tight:8.3f} "
              f"{step / tight if tight else float('nan'):10.2f} {mine[0].compute_s / step:10.2f} "
              f"{statistics.median(r.mb_per_host_step for r in mine):12.1f} "
              f"{statistics.median(r.stall_s for r in mine):10.3f} {statistics.median(r.key0_stall_s for r in mine):8.3f} "
              f"{statistics.median(r.busy_util for r in mine):10.0%} {statistics.median(r.idle_s for r in mine):6.3f} "
              f"{max(r.cpu_load for r in mine):8.0%}  {' '.join(f'{r.step_s:.3f}' for r in mine)}")
    by_rep: dict[int, dict[str, float]] = {}
    for r in runs:
        by_rep.setdefault(r.rep, {})[r.impl] = r.step_s
    names = list(dict.fromkeys(r.impl for r in runs))
    for num, den in [(n, d) for d in ("native", "ps", "ps-fifo", "ddp") for n in names if n != d]:
        ratios = [v[num] / v[den] for v in by_rep.values() if num in v and den in v]
        if ratios:
            print(f"{num} / {den} step time: {statistics.median(ratios):.2f} "
                  f"(per rep: {' '.join(f'{x:.2f}' for x in ratios)})")
    if any(r.start_s for r in runs):
        print(f"{'impl':{width}} {'formed s':>8} {'from launch s':>13} {'max RSS MB':>10} {'max TCP conns':>13} "
              f"{'max threads':>11} {'scheduler CPU':>13}")
        for impl in dict.fromkeys(r.impl for r in runs):
            mine = [r for r in runs if r.impl == impl]
            print(f"{impl:{width}} {statistics.median(r.form_s for r in mine):8.2f} "
                  f"{statistics.median(r.start_s for r in mine):13.1f} {max(r.rss_mb for r in mine):10.0f} "
                  f"{max(r.conns for r in mine):13.0f} {max(r.threads for r in mine):11.0f} "
                  f"{statistics.median(r.sched_cpu for r in mine):13.1%}")
    if any(r.cpu_load > CPU_LIMIT for r in runs):
        print(f"# WARNING: a run used more than {CPU_LIMIT:.0%} of the machine's CPUs: it measured the CPU, not "
              "the links; do not quote it")
