"""Results of ``python -m ps.bench``: per-repetition rows, medians, ratios, CSV, tables, chart.

A *row* is one repetition of one case on one implementation; its round time is the
median over the timed rounds of the slowest worker's round (sync rounds end together).
Throughput counts what a worker moves per round, push plus pull: ``2 * bytes / time``.
"""
from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

TARGETS = {"1x64M": 2.0, "8x2M": 1.0, "200x16K": 1.2}   # issue #6, W2 S2: native / ps time
GLUON_TARGET = 1.0                                      # ps step time <= 1.0 x native
MEM_FACTOR, MEM_SLACK = 1.25, 64 << 20                  # RSS <= 1.25 x (values + state) + 64 MB


@dataclass
class Row:
    row: str                 # "rep", "median" or "memory"
    impl: str                # "ps" or "native"
    workers: int
    servers: int
    case: str                # "1x4K", "200x16K", "gluon-mlp", ...
    keys: int = 0
    key_bytes: int = 0
    round_bytes: int = 0     # bytes one worker pushes per round (= bytes it pulls)
    rep: Any = ""
    rounds: int = 0
    round_ms: float = 0.0    # rep: median over rounds; median: median over reps
    round_ms_p90: float = 0.0
    worker_gbps: float = 0.0
    aggregate_gbps: float = 0.0
    speedup: Any = ""        # native time / ps time (on ps rows: paired rep, or medians)
    ab: Any = ""             # --ab: ps-b time / ps time (on ps rows)
    cpu_busy_pct: Any = ""
    foreign_pct: Any = ""
    variant: str = ""        # native: pushpull or push-pull
    worker_cpu_ms: Any = ""  # CPU ms one worker / one server used per round (rep and median rows)
    server_cpu_ms: Any = ""
    server_rss_mb: Any = ""  # memory rows
    server_hwm_mb: Any = ""
    stored_mb: Any = ""
    limit_mb: Any = ""
    ok: Any = ""
    extra: dict = field(default_factory=dict, repr=False)


COLUMNS = [f.name for f in fields(Row) if f.name != "extra"]


def rep_row(impl: str, workers: int, servers: int, case: dict[str, Any], rep: int,
            answers: list[dict[str, Any]], busy: float, foreign: float) -> Row:
    per_worker = np.array([a["times_ms"] for a in answers], dtype=float)
    rounds = per_worker.max(axis=0)
    med = float(np.median(rounds))
    gbps = 2 * case["round_bytes"] / (med * 1e-3) / 1e9 if case["round_bytes"] else 0.0
    return Row("rep", impl, workers, servers, case["name"], keys=case["keys"], key_bytes=case["key_bytes"],
               round_bytes=case["round_bytes"], rep=rep, rounds=len(rounds), round_ms=round(med, 4),
               round_ms_p90=round(float(np.percentile(rounds, 90)), 4), worker_gbps=round(gbps, 4),
               aggregate_gbps=round(gbps * workers, 4), cpu_busy_pct=round(busy, 1),
               foreign_pct=round(foreign, 1), variant=answers[0].get("variant", ""),
               worker_cpu_ms=_round(answers[0].get("cpu_ms", {}).get("worker")),
               server_cpu_ms=_round(answers[0].get("cpu_ms", {}).get("server")))


def _round(x: Any) -> Any:
    return "" if x is None else round(float(x), 3)


def _median(values: list[Any]) -> Any:
    values = [v for v in values if v != ""]
    return round(statistics.median(values), 3) if values else ""


def pair_and_summarize(rows: list[Row]) -> list[Row]:
    """Fill paired speedups into ps rep rows; return one median row per (config, case, impl)."""
    groups: dict[tuple, dict[str, list[Row]]] = {}
    for r in rows:
        if r.row == "rep":
            groups.setdefault((r.workers, r.servers, r.case), {}).setdefault(r.impl, []).append(r)
    out = []
    for (w, s, case), by_impl in groups.items():
        medians = {}
        for impl, reps in by_impl.items():
            t = statistics.median(r.round_ms for r in reps)
            first = reps[0]
            gbps = 2 * first.round_bytes / (t * 1e-3) / 1e9 if first.round_bytes else 0.0
            medians[impl] = Row("median", impl, w, s, case, keys=first.keys, key_bytes=first.key_bytes,
                                round_bytes=first.round_bytes, rounds=first.rounds, round_ms=round(t, 4),
                                round_ms_p90=round(statistics.median(r.round_ms_p90 for r in reps), 4),
                                worker_gbps=round(gbps, 4), aggregate_gbps=round(gbps * w, 4),
                                cpu_busy_pct=round(statistics.median(r.cpu_busy_pct for r in reps), 1),
                                foreign_pct=round(max(r.foreign_pct for r in reps), 1),
                                worker_cpu_ms=_median([r.worker_cpu_ms for r in reps]),
                                server_cpu_ms=_median([r.server_cpu_ms for r in reps]))
        for other, attr in (("native", "speedup"), ("ps-b", "ab")):
            if "ps" in by_impl and other in by_impl:
                ref = {r.rep: r for r in by_impl[other]}
                for r in by_impl["ps"]:
                    if r.rep in ref:
                        setattr(r, attr, round(ref[r.rep].round_ms / r.round_ms, 3))
                setattr(medians["ps"], attr, round(medians[other].round_ms / medians["ps"].round_ms, 3))
        out += medians.values()
    return out


def write_csv(path: str, rows: Iterable[Row]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        for r in rows:
            d = asdict(r)
            d.pop("extra")
            writer.writerow(d)


def read_csv(path: str) -> list[Row]:
    """Rows of a CSV written by :func:`write_csv` (to redraw tables and the chart)."""
    kinds = {f.name: f.type for f in fields(Row)}
    rows = []
    with open(path, newline="") as fh:
        for d in csv.DictReader(fh):
            values: dict[str, Any] = {}
            for name, raw in d.items():
                if name not in kinds or raw == "":
                    continue
                if raw in ("True", "False"):
                    values[name] = raw == "True"
                elif name in ("row", "impl", "case", "variant"):
                    values[name] = raw
                else:
                    num = float(raw)
                    values[name] = int(num) if num.is_integer() and ("int" in str(kinds[name]) or name == "rep") else num
            rows.append(Row(**values))
    return rows


def _fmt_ms(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def table(rows: list[Row], markdown: bool = False) -> str:
    """Per config and case: medians, ratio, per-rep ratios, throughput, load."""
    medians = [r for r in rows if r.row == "median"]
    reps = [r for r in rows if r.row == "rep"]
    head = ["config", "case", "ps ms", "native ms", "speedup", "per-rep speedups", "ps agg GB/s",
            "native agg GB/s", "max foreign %"]
    with_b = any(r.impl == "ps-b" for r in medians)
    if with_b:
        head += ["ps-b ms", "ps-b/ps", "per-rep ps-b/ps"]
    lines = []
    keys = sorted({(r.workers, r.servers, r.case) for r in medians},
                  key=lambda k: (k[0], k[1], _case_order(k[2])))
    for w, s, case in keys:
        m = {r.impl: r for r in medians if (r.workers, r.servers, r.case) == (w, s, case)}
        ps, nat = m.get("ps"), m.get("native")
        per_rep = [r.speedup for r in reps if (r.workers, r.servers, r.case, r.impl) == (w, s, case, "ps")
                   and r.speedup != ""]
        target = TARGETS.get(case) if (w, s) == (2, 2) else None
        sp = ""
        if ps and nat:
            sp = f"{ps.speedup:.2f}x"
            if target:
                sp += f" ({'meets' if ps.speedup >= target else 'misses'} >= {target:g})"
        foreign = max([r.foreign_pct for r in (ps, nat) if r is not None], default=0)
        gb = "GB/s" if not case.startswith("gluon") else "-"
        line = [f"W{w} S{s}", case, _fmt_ms(ps.round_ms) if ps else "-", _fmt_ms(nat.round_ms) if nat else "-",
                sp or "-", " ".join(f"{x:.2f}" for x in per_rep) or "-",
                f"{ps.aggregate_gbps:.2f}" if ps and gb != "-" else "-",
                f"{nat.aggregate_gbps:.2f}" if nat and gb != "-" else "-", f"{foreign:.0f}"]
        if with_b:
            b = m.get("ps-b")
            ab_reps = [r.ab for r in reps if (r.workers, r.servers, r.case, r.impl) == (w, s, case, "ps")
                       and r.ab != ""]
            line += [_fmt_ms(b.round_ms) if b else "-", f"{ps.ab:.2f}x" if ps and ps.ab != "" else "-",
                     " ".join(f"{x:.2f}" for x in ab_reps) or "-"]
        lines.append(line)
    return _render(head, lines, markdown)


def cpu_table(rows: list[Row], markdown: bool = False) -> str:
    """Per config, case and implementation: CPU ms per round of one worker, one server, and
    of the whole job (W workers + S servers): on a machine with few cores, where the
    processes share them, this total is what bounds the round time."""
    med = [r for r in rows if r.row == "median" and r.worker_cpu_ms != ""]
    if not med:
        return ""
    head = ["config", "case", "impl", "worker CPU ms", "server CPU ms", "job CPU ms"]
    med.sort(key=lambda r: (r.workers, r.servers, _case_order(r.case), r.impl))
    lines = []
    for r in med:
        server = r.server_cpu_ms if r.server_cpu_ms != "" else 0.0
        lines.append([f"W{r.workers} S{r.servers}", r.case, r.impl, _fmt_ms(r.worker_cpu_ms), _fmt_ms(server),
                      _fmt_ms(r.workers * r.worker_cpu_ms + r.servers * server)])
    return _render(head, lines, markdown)


def memory_table(rows: list[Row], markdown: bool = False) -> str:
    mem = [r for r in rows if r.row == "memory"]
    if not mem:
        return ""
    head = ["config", "case", "impl", "server", "RSS MB", "peak RSS MB", "stored+state MB", "limit MB", "check"]
    lines = [[f"W{r.workers} S{r.servers}", r.case, r.impl, str(r.rep), f"{r.server_rss_mb:.0f}",
              f"{r.server_hwm_mb:.0f}", f"{r.stored_mb:.1f}" if r.stored_mb != "" else "-",
              f"{r.limit_mb:.0f}" if r.limit_mb != "" else "-",
              {True: "ok", False: "OVER"}.get(r.ok, "-")] for r in mem]
    return _render(head, lines, markdown)


def _render(head: list[str], lines: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*line) for line in [head, *lines])


def _case_order(case: str) -> tuple:
    if case.startswith("gluon"):
        return (2, 0, case)
    n, _, size = case.partition("x")
    return (0 if n == "1" else 1, parse_size(size) if size else 0, case)


def parse_size(text: str) -> int:
    """'4K' / '64KB' / '2M' / '2MB' / '4096' -> bytes (K = 1024)."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if mult != 1 else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise ValueError(f"bad size {text!r}; write e.g. 4K, 64K, 2M, 64M") from None
    if value <= 0 or value % 4:
        raise ValueError(f"size {text!r} must be a positive multiple of 4 bytes (float32)")
    return value


def size_label(nbytes: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return str(nbytes)


def plot(rows: list[Row], path: str) -> None:
    """Throughput vs size, aggregate throughput vs workers, and speedup per case."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = [r for r in rows if r.row == "median" and not r.case.startswith("gluon")]
    if not med:
        return
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.8))
    colors = {"ps": "tab:blue", "native": "tab:orange", "ps-b": "tab:gray"}
    configs = sorted({(r.workers, r.servers) for r in med})
    main_cfg = (2, 2) if (2, 2) in configs else configs[0]
    styles = ["-", "--", ":", "-."]

    ax = axes[0]
    for i, (w, s) in enumerate(configs):
        for impl in ("ps", "native", "ps-b"):
            pts = sorted((r.key_bytes, r.aggregate_gbps) for r in med
                         if (r.workers, r.servers, r.impl) == (w, s, impl) and r.keys == 1)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[i % 4], marker="o", color=colors[impl],
                        label=f"{impl} W{w} S{s}", alpha=1.0 if (w, s) == main_cfg else 0.55)
    ax.set_xscale("log", base=2)
    sizes = sorted({r.key_bytes for r in med if r.keys == 1})
    ax.set_xticks(sizes, [size_label(x) for x in sizes])
    ax.set(xlabel="value size (one key)", ylabel="aggregate GB/s (2 x bytes x workers / round)",
           title="Throughput vs value size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)

    ax = axes[1]
    scaling_cases = [c for c in ("1x4M", "8x2M", "1x64M", "200x16K") if any(r.case == c for r in med)]
    servers = sorted({s for _, s in configs})
    markers = "osD^v"
    for j, case in enumerate(scaling_cases):
        for i, s in enumerate(servers):
            for impl in ("ps", "native", "ps-b"):
                pts = sorted((r.workers, r.aggregate_gbps) for r in med
                             if (r.case, r.servers, r.impl) == (case, s, impl))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[i % 4], marker=markers[j % 5],
                            color=colors[impl], label=f"{impl} {case} S{s}")
    ax.set_xticks(sorted({w for w, _ in configs}))
    ax.set(xlabel="workers", ylabel="aggregate GB/s", title="Scaling: aggregate throughput vs workers")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)

    ax = axes[2]
    ps_rows = sorted([r for r in med if r.impl == "ps" and (r.workers, r.servers) == main_cfg and r.speedup != ""],
                     key=lambda r: _case_order(r.case))
    if ps_rows:
        xs = np.arange(len(ps_rows))
        ax.bar(xs, [r.speedup for r in ps_rows], color=["tab:green" if r.speedup >= 1 else "tab:red" for r in ps_rows])
        for x, r in zip(xs, ps_rows):
            ax.text(x, r.speedup, f"{r.speedup:.2f}", ha="center", va="bottom", fontsize=8)
            if r.case in TARGETS:
                ax.plot([x - 0.4, x + 0.4], [TARGETS[r.case]] * 2, "k--", lw=1)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(xs, [r.case for r in ps_rows], rotation=30)
    ax.set(ylabel="native time / ps time (higher = ps faster)",
           title=f"Speedup per case, W{main_cfg[0]} S{main_cfg[1]} (dashes: targets)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
