"""The dashboard's picture of a job (ps/jobview.py) and what nodes report (ps/nodestats.py):
pure, on a clock the test moves."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from ps.jobview import JobFacts, JobView, NodeFacts, clean, quantile
from ps.nodestats import BUCKETS, MAX_STALL_KEYS, MAX_STALLS, Histogram, StallClock, stall_list
from tests.helpers import Clock


def node(node_id: int, role: str, rank: int, state: str = "alive", incarnation: int = 0,
         reason: str | None = None) -> NodeFacts:
    return NodeFacts(node_id, f"{role[0].upper()}[{node_id}]", role, rank, "10.0.0.1", "box", 4000 + node_id,
                     1.0, incarnation, state, reason)


def facts(*nodes: NodeFacts, state: str = "running", ended: tuple[int, str] | None = None,
          restarts: int = 0) -> JobFacts:
    return JobFacts(state, "dist_sync", 2, 1, restarts, 1.0, nodes, (), ended)


NODES = (node(8, "server", 0), node(9, "worker", 0), node(11, "worker", 1))


def report(step: int, sent: int, buckets: list[int] | None = None, **extra) -> dict:
    body = {"bytes_sent": sent, "bytes_received": sent, "cpu_seconds": step / 10, "rss_bytes": 1 << 20,
            "step": step, "in_flight": 1}
    if buckets is not None:
        body["latency_buckets"] = buckets
    body.update(extra)
    return body


def test_events_follow_the_nodes_states():
    clock = Clock()
    view = JobView(clock, wall=clock)
    view.observe(facts(*NODES))
    died = node(11, "worker", 1, "dead", reason="worker 1 (W[11]) died: connection closed")
    clock.now += 1
    view.observe(facts(NODES[0], NODES[1], died))
    clock.now += 1
    view.observe(facts(NODES[0], NODES[1], node(11, "worker", 1, "restarting", incarnation=1), restarts=1))
    clock.now += 1
    view.observe(facts(NODES[0], node(9, "worker", 0, "closed"), node(11, "worker", 1, incarnation=1),
                       state="ended", ended=(0, "")))
    kinds = [(e["kind"], e["node"]) for e in view.state(facts(*NODES))["events"]]
    assert kinds == [("joined", "server 0"), ("joined", "worker 0"), ("joined", "worker 1"), ("formed", None),
                     ("died", "worker 1"), ("restarted", "worker 1"), ("closed", "worker 0"), ("ended", None)]
    texts = [e["text"] for e in view.state(facts(*NODES))["events"]]
    assert "connection closed" in texts[4] and texts[-1] == "the job finished"


def test_a_failed_job_says_why():
    view = JobView(Clock())
    view.observe(facts(*NODES, state="ended", ended=(1, "server 0 died")))
    assert view.state(facts(*NODES))["events"][-1]["text"] == "the job failed: server 0 died"


def test_rates_and_history_come_from_counter_differences():
    clock = Clock()
    view = JobView(clock, wall=clock)
    zero = [0] * (len(BUCKETS) + 1)
    for i in (9, 11):
        view.report(i, report(10, 1000, zero))
    view.observe(facts(*NODES))
    clock.now += 2.0
    fast = list(zero)
    fast[BUCKETS.index(0.005)] = 100        # 100 round trips in (2.5 ms, 5 ms]
    view.report(9, report(30, 5000, fast))
    view.report(11, report(20, 3000, fast))
    view.observe(facts(*NODES))
    state = view.state(facts(*NODES))
    history = state["history"]
    assert history["steps_per_second"][-1] == pytest.approx(7.5)       # median of 10/s and 5/s
    assert history["bytes_per_second"][-1] == pytest.approx((4000 + 2000) / 2.0)
    assert 0.0025 < history["latency_p50"][-1] <= 0.005
    row = next(n for n in state["nodes"] if n["id"] == 9)
    assert row["bytes_out_per_s"] == pytest.approx(2000.0) and row["cpu_percent"] == pytest.approx(100.0)
    assert state["job"]["step"] == 25 and state["job"]["steps_per_second"] == pytest.approx(7.5)


def test_a_restarted_nodes_counters_start_again():
    clock = Clock()
    view = JobView(clock, wall=clock)
    view.report(9, report(50, 10_000))
    view.observe(facts(*NODES))
    clock.now += 1
    view.observe(facts(NODES[0], node(9, "worker", 0, incarnation=1), NODES[2]))
    row = next(n for n in view.state(facts(*NODES))["nodes"] if n["id"] == 9)
    assert row["restarts"] == 1 and row["step"] is None     # the old process's report is gone


def test_a_node_that_stops_reporting_shows_as_silent():
    clock = Clock()
    view = JobView(clock, wall=clock)       # the nodes registered at time 1.0
    view.report(9, report(1, 1))
    clock.now += 10
    view.report(11, report(1, 1))
    view.report(9, report(1, 1))        # two reports: rates, while it reports
    rows = {n["id"]: n for n in view.state(facts(*NODES))["nodes"]}
    assert {i: n["state"] for i, n in rows.items()} == {8: "silent", 9: "alive", 11: "alive"}
    clock.now += 10
    rows = {n["id"]: n for n in view.state(facts(*NODES))["nodes"]}
    assert rows[9]["state"] == "silent" and rows[9]["bytes_out_per_s"] is None     # not its last, stale rate


def test_server_stalls_are_named_then_go_on():
    clock = Clock()
    view = JobView(clock, wall=clock)
    stall = {"round": 12, "keys": [3, 4], "missing": [1], "waiting": [0], "seconds": 5.0}
    view.report(8, {"rounds_closed": 11, "stalls": [stall]})
    view.observe(facts(*NODES))
    state = view.state(facts(*NODES))
    [current] = state["stalls"]
    assert current["by"] == "server 0" and current["keys"] == [3, 4]
    assert current["waiting_for"] == ["worker 1 (W[11] on 10.0.0.1)"] and current["waiting"] == ["worker 0"]
    assert "sync round 12 of keys 3, 4 has waited 5s for worker 1" in current["text"]
    view.report(8, {"rounds_closed": 12, "stalls": []})
    view.observe(facts(*NODES))
    kinds = [e["kind"] for e in view.state(facts(*NODES))["events"]]
    assert kinds[-2:] == ["stalled", "went_on"] and view.state(facts(*NODES))["stalls"] == []


@pytest.mark.parametrize("body", [None, [], "x", {"step": -1}, {"step": float("nan")}, {"step": True},
                                  {"latency_buckets": [1, 2]}, {"stalls": [{"round": "x"}]}, {"cpu_seconds": "1"}])
def test_a_malformed_report_keeps_nothing_bad(body):
    cleaned = clean(body)
    assert cleaned is None or all(k not in cleaned for k in ("step", "latency_buckets", "cpu_seconds")) and \
        cleaned.get("stalls", []) == []


def test_a_report_is_bounded_whatever_a_node_sends():
    huge = {"round": 1, "keys": list(range(10_000)), "missing": list(range(10_000)), "waiting": [], "seconds": 1}
    cleaned = clean({"stalls": [huge] * 1000, "unknown": "x" * 10_000})
    assert len(cleaned["stalls"]) == MAX_STALLS and len(cleaned["stalls"][0]["keys"]) == MAX_STALL_KEYS
    assert "unknown" not in cleaned
    assert len(stall_list([huge] * 100)) == MAX_STALLS


@given(st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), min_size=1, max_size=200),
       st.sampled_from([0.5, 0.95]))
def test_quantile_lies_in_the_bucket_of_the_true_quantile(samples, q):
    hist = Histogram()
    for s in samples:
        hist.observe(s)
    got = quantile(q, hist.counts)
    true = sorted(samples)[max(0, math.ceil(q * len(samples)) - 1)]
    bounds = (0.0, *BUCKETS)
    i = next((j for j, b in enumerate(BUCKETS) if true <= b), len(BUCKETS))
    assert got is not None
    if i < len(BUCKETS):
        assert bounds[i] <= got <= BUCKETS[i] + 1e-12
    else:
        assert got == BUCKETS[-1]
    assert hist.total == pytest.approx(sum(samples))


def test_quantile_of_nothing_is_unknown():
    assert quantile(0.5, [0] * (len(BUCKETS) + 1)) is None


def test_stall_clock_counts_while_stalled():
    clock = Clock()
    stalled = StallClock(clock)
    stalled.set(True)
    clock.now += 2
    assert stalled.seconds() == 2
    stalled.set(True)               # still the same stall
    clock.now += 1
    stalled.set(False)
    clock.now += 5
    assert stalled.seconds() == 3
