"""What the benchmark measures besides time: memory, listening ports and CPU of its processes
(psutil), and how busy the machine is, so a run disturbed by other tenants is flagged."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` in bytes (empty when the process is gone). psutil has no
    peak RSS (VmHWM), so that one line still comes from /proc."""
    out = {}
    try:
        out["VmRSS"] = psutil.Process(pid).memory_info().rss
        with open(f"/proc/{pid}/status") as fh:
            hwm = next((line for line in fh if line.startswith("VmHWM:")), None)
        if hwm is not None:
            out["VmHWM"] = int(hwm.split()[1]) * 1024
    except (psutil.Error, OSError):
        pass
    return out


class PeakRss(threading.Thread):
    """The highest VmHWM each of ``pids`` reaches (servers exit before a driver could ask):
    ``peaks`` per pid, in order; ``peak`` their highest. Set ``done`` to stop watching."""

    def __init__(self, pids: list[int]):
        super().__init__(daemon=True)
        self.pids, self.peaks, self.done = pids, [0] * len(pids), threading.Event()

    @property
    def peak(self) -> int:
        return max(self.peaks, default=0)

    def run(self) -> None:
        while not self.done.wait(0.5):
            for i, pid in enumerate(self.pids):
                self.peaks[i] = max(self.peaks[i], proc_status(pid).get("VmHWM", 0))


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of every thread of ``pid`` (0 when gone)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


CPU_LIMIT = 0.70    # a multi-host run above this share of the machine's CPUs measured the machine (flagged)


def machine_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of all CPUs since boot."""
    t = psutil.cpu_times()
    total = sum(t)
    return total - t.idle - getattr(t, "iowait", 0.0), total


def load_between(start: tuple[float, float], end: tuple[float, float]) -> float:
    """The machine's busy share (0..1) between two :func:`machine_seconds` readings."""
    return (end[0] - start[0]) / max(1e-9, end[1] - start[1])


class CpuWindow:
    """CPU use during a window: machine busy %, and busy % not accounted to ``pids`` ("foreign")."""

    def __init__(self, pids: list[int]):
        self.pids = [*pids, os.getpid()]
        self.busy0, self.total0 = machine_seconds()
        self.ours0 = sum(cpu_seconds(p) for p in self.pids)

    def close(self) -> tuple[float, float]:
        busy, total = machine_seconds()
        ours = sum(cpu_seconds(p) for p in self.pids)
        span = max(1e-9, total - self.total0)
        busy_pct = 100.0 * (busy - self.busy0) / span
        foreign = 100.0 * max(0.0, (busy - self.busy0) - (ours - self.ours0)) / span
        return busy_pct, foreign


class RoleCpu:
    """CPU time each worker and each server of one cluster spends in a window (ms)."""

    def __init__(self, cluster: Any):
        self.roles = {"worker": [p.pid for p in cluster.workers], "server": list(cluster.server_pids)}
        self.start = {pid: cpu_seconds(pid) for pids in self.roles.values() for pid in pids}

    def per_process_ms(self) -> dict[str, float]:
        """Mean over the role's processes of the CPU ms each used since the start."""
        return {role: sum(cpu_seconds(p) - self.start[p] for p in pids) * 1000.0 / len(pids)
                for role, pids in self.roles.items() if pids}


def settle(pids: list[int], max_foreign: float, timeout: float, sample: float = 0.25) -> float:
    """Wait (at most ``timeout`` s) until other tenants use < ``max_foreign`` % CPU; return last %."""
    deadline = time.monotonic() + timeout
    while True:
        win = CpuWindow(pids)
        time.sleep(sample)
        _, foreign = win.close()
        if foreign < max_foreign or time.monotonic() >= deadline:
            return foreign
