"""A real job with its dashboard on, for the dashboard tests: ``python -m ps.launch -n 2
-s 2 --dashboard 127.0.0.1:0`` running tests/dashboard/dash_worker.py until the test is done."""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import PYTHON, ROOT, poll_for
from tests.launcher.launch_util import Launch

WORKER = str(ROOT / "tests" / "dashboard" / "dash_worker.py")
URL = re.compile(r"^\[launcher\] dashboard: (http://\S+)")


class Job:
    """A launched job whose dashboard the test reads; ``stop()`` ends it cleanly."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None):
        self.stop_file = tmp / "stop"
        self.launch = Launch(["-n", "2", "-s", "2", "--dashboard", "127.0.0.1:0", *args,
                              "--env", f"PS_TEST_STOP:{self.stop_file}", "--env", "PS_TEST_SECONDS:90",
                              "--env", "PS_HEARTBEAT_INTERVAL:0.5", PYTHON, WORKER], env=env)
        self.launch.wait_for(lambda j: any(URL.match(ln) for ln in j.lines), 30)
        self.url = next(URL.match(ln).group(1) for ln in self.launch.lines if URL.match(ln))
        self.launch.wait_for(lambda j: all(self.pid(r) for r in (0, 1)), 60)

    def pid(self, rank: int) -> int | None:
        """The pid worker ``rank`` printed last (a restart prints its own)."""
        found = [ln for ln in self.launch.matching(f"[worker {rank}] rank={rank} pid=")]
        return int(found[-1].rsplit("=", 1)[1]) if found else None

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        with urllib.request.urlopen(self.url.rstrip("/") + path, timeout=timeout) as r:
            return r.read()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, parsed by prometheus_client's own parser."""
        text = self.get("/metrics").decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self, timeout: float = 60) -> int:
        self.stop_file.touch()
        return self.launch.wait(timeout)


def node_value(samples: dict, name: str, role: str, rank: int, **labels: str) -> float | None:
    """The sample ``name`` of node ``role`` ``rank`` (any host), or None."""
    for (sample, got), value in samples.items():
        have = dict(got)
        if sample == name and have.get("role") == role and have.get("rank") == str(rank) and \
                all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


def wait_metric(job: Job, pred, timeout: float, what: str) -> dict:
    """Scrape until ``pred(samples)``; fails naming ``what`` with the last scrape's node states."""
    last: dict = {}

    def check():
        nonlocal last
        try:
            last = job.metrics()
        except OSError:
            return False
        return pred(last)
    if not poll_for(check, timeout, 0.05):
        states = {k: v for k, v in last.items() if k[0] == "ps_node_state"}
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; node states: {states}\n"
                             f"launcher output:\n{job.launch.output}")
    return last


@pytest.fixture
def job(tmp_path):
    made: list[Job] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Job:
        made.append(Job(tmp_path, *args, env=env))
        return made[-1]
    yield start
    for j in made:
        j.stop_file.touch()
        poll_for(lambda: j.launch.proc.poll() is not None, 15)
        j.launch.cleanup()              # the launcher's group and every process of the job, by pid
