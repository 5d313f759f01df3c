"""/metrics during a real 2x2 job, read with prometheus_client's own parser: every node with
its labels, counters that grow, and a killed worker seen dead (then restarted, with
--max-restarts)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.dashboard.conftest import node_value, wait_metric

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

NODES = [("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]


def stepping(samples) -> bool:
    """Both workers past step 2, and every node has reported (its first report comes one
    heartbeat interval after it joined)."""
    return all((node_value(samples, "ps_node_step", "worker", r) or 0) > 2 for r in (0, 1)) and \
        all(node_value(samples, "ps_node_resident_memory_bytes", role, rank) for role, rank in NODES)


def test_every_node_is_there_with_its_labels_and_its_counters_grow(job):
    j = job()
    first = wait_metric(j, stepping, 30, "both workers stepping")
    for role, rank in NODES:
        assert node_value(first, "ps_node_up", role, rank, host="127.0.0.1") == 1.0, (role, rank)
        assert node_value(first, "ps_node_state", role, rank, state="alive") == 1.0, (role, rank)
        assert node_value(first, "ps_node_resident_memory_bytes", role, rank) > 10 << 20
    time.sleep(1.5)             # two more reports from every node (PS_HEARTBEAT_INTERVAL=0.5)
    second = wait_metric(j, lambda s: s.get(("ps_job_steps_per_second", ()), 0) > 0, 10,
                         "a step rate (two history samples a second apart)")
    grow = {"ps_node_sent_bytes_total": NODES, "ps_node_received_messages_total": NODES,
            "ps_node_cpu_seconds_total": NODES, "ps_node_step": NODES[2:],
            "ps_node_round_trip_seconds_count": NODES[2:], "ps_node_sync_rounds_closed_total": NODES[:2]}
    for name, nodes in grow.items():
        for role, rank in nodes:
            before, after = node_value(first, name, role, rank), node_value(second, name, role, rank)
            assert before is not None and after > before, (name, role, rank, before, after)
    assert second[("ps_job_state", (("state", "running"),))] == 1.0
    state = json.loads(j.get("/api/state"))
    assert sorted((n["role"], n["rank"]) for n in state["nodes"]) == sorted(NODES)
    assert [e["kind"] for e in state["events"]].count("joined") == 4
    assert j.stop() == 0


def test_a_killed_worker_is_seen_dead_then_restarted(job):
    j = job("--max-restarts", "1", "--env", "PS_TEST_RESTART_DELAY:3")
    wait_metric(j, stepping, 30, "both workers stepping")
    os.kill(j.pid(1), signal.SIGKILL)
    wait_metric(j, lambda s: node_value(s, "ps_node_state", "worker", 1, state="dead") == 1.0, 30,
                "worker 1 shown dead")
    after = wait_metric(j, lambda s: node_value(s, "ps_node_restarts_total", "worker", 1) == 1.0 and
                        node_value(s, "ps_node_state", "worker", 1, state="alive") == 1.0, 60,
                        "worker 1 shown restarted and alive")
    assert after[("ps_job_restarts_total", ())] == 1.0
    kinds = [(e["kind"], e["node"]) for e in json.loads(j.get("/api/events"))]
    assert ("died", "worker 1") in kinds and ("restarted", "worker 1") in kinds
    assert kinds.index(("died", "worker 1")) < kinds.index(("restarted", "worker 1"))
    assert j.stop() == 0


def test_without_restarts_a_killed_worker_is_seen_dead_as_the_job_ends(job):
    j = job("--env", "PS_DASHBOARD_LINGER:5")
    wait_metric(j, stepping, 30, "both workers stepping")
    os.kill(j.pid(1), signal.SIGKILL)
    last = wait_metric(j, lambda s: node_value(s, "ps_node_state", "worker", 1, state="dead") == 1.0, 30,
                       "worker 1 shown dead")
    assert node_value(last, "ps_node_up", "worker", 1) == 0.0
    assert last[("ps_job_state", (("state", "ended"),))] == 1.0
    events = json.loads(j.get("/api/events"))
    assert events[-1]["kind"] == "ended" and "worker 1 was killed by SIGKILL" in events[-1]["text"]
    assert j.launch.wait(60) != 0
