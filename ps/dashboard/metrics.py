"""``/metrics``: the job in Prometheus' text format, made by prometheus_client from the
scheduler's picture of the job at each scrape (a custom collector: nothing is kept twice).

Every node's series carry the labels ``role``, ``rank`` and ``host``; counters restart from
zero when a node restarts, which Prometheus' ``rate()`` reads as a counter reset.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from ..jobview import JobFacts, JobView
from ..nodestats import BUCKETS

LABELS = ("role", "rank", "host")
# (report field, metric name, help) of each node counter
_COUNTERS = (
    ("bytes_sent", "ps_node_sent_bytes", "Bytes of ps messages this node sent (meta and data frames)."),
    ("bytes_received", "ps_node_received_bytes", "Bytes of ps messages this node received."),
    ("messages_sent", "ps_node_sent_messages", "ps messages this node sent."),
    ("messages_received", "ps_node_received_messages", "ps messages this node received."),
    ("resent", "ps_node_resent_messages", "Messages this node sent again, unacknowledged (PS_RESEND)."),
    ("rounds_closed", "ps_node_sync_rounds_closed", "Sync rounds this server closed (all keys)."),
    ("stalled_seconds", "ps_node_stalled_seconds",
     "Seconds this node spent in a stall someone named (a wait past PS_STALL_WARNING)."),
    ("cpu_seconds", "ps_node_cpu_seconds", "CPU time of this node's process (user and system)."),
)
_GAUGES = (
    ("rss_bytes", "ps_node_resident_memory_bytes", "Resident memory of this node's process."),
    ("in_flight", "ps_node_requests_in_flight", "Requests this worker sent that are not fully answered."),
    ("step", "ps_node_step", "This worker's pushes of its most-pushed key (its training step)."),
)


class JobCollector:
    """Reads ``facts()`` (the scheduler's, thread-safe) and the view's reports per scrape."""

    def __init__(self, view: JobView, facts: Callable[[], JobFacts]):
        self.view, self.facts = view, facts

    def collect(self) -> Iterator[Metric]:
        facts = self.facts()
        state = self.view.state(facts)
        reports = self.view.reports()
        labelled = [(n, [n["role"], str(n["rank"]), n["host"]]) for n in state["nodes"]]

        up = GaugeMetricFamily("ps_node_up", "1 while the node is part of the running job and reports; "
                               "0 when dead, silent or gone.", labels=LABELS)
        node_state = GaugeMetricFamily("ps_node_state", "1 for the node's current state: alive, silent, dead "
                                       "(awaiting its restart, or it ended the job), restarting, closed, ended.",
                                       labels=(*LABELS, "state"))
        restarts = CounterMetricFamily("ps_node_restarts", "Times this node was restarted (PS_MAX_RESTARTS).",
                                       labels=LABELS)
        heard = GaugeMetricFamily("ps_node_last_report_age_seconds", "Seconds since this node's last report "
                                  "(its heartbeat).", labels=LABELS)
        for row, labels in labelled:
            up.add_metric(labels, 1.0 if row["state"] in ("alive", "closed") else 0.0)
            node_state.add_metric([*labels, row["state"]], 1.0)
            restarts.add_metric(labels, row["restarts"])
            if row["last_heard"] is not None:
                heard.add_metric(labels, row["last_heard"])
        yield from (up, node_state, restarts, heard)

        for kind, table in ((CounterMetricFamily, _COUNTERS), (GaugeMetricFamily, _GAUGES)):
            for field, name, doc in table:
                family = kind(name, doc, labels=LABELS)
                for row, labels in labelled:
                    value = reports.get(row["id"], {}).get(field)
                    if value is not None:
                        family.add_metric(labels, value)
                yield family
        yield _latency(labelled, reports)
        yield from _job(state)


def _latency(labelled: list[tuple[dict[str, Any], list[str]]], reports: dict[int, dict[str, Any]]) -> Metric:
    family = HistogramMetricFamily("ps_node_round_trip_seconds", "Seconds from a worker's request (push, "
                                   "pull, pushpull) to its complete answer.", labels=LABELS)
    for row, labels in labelled:
        rep = reports.get(row["id"], {})
        counts = rep.get("latency_buckets")
        if counts is None:
            continue
        cumulative, total = [], 0
        for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts):
            total += n
            cumulative.append((bound, total))
        family.add_metric(labels, cumulative, rep.get("latency_sum", 0.0))
    return family


def _job(state: dict[str, Any]) -> Iterator[Metric]:
    job = state["job"]
    running = GaugeMetricFamily("ps_job_state", "1 for the job's current state: forming, running, ended.",
                                labels=("state",))
    running.add_metric([job["state"]], 1.0)
    yield running
    nodes = GaugeMetricFamily("ps_job_nodes", "Nodes the job has, by role.", labels=("role",))
    nodes.add_metric(["worker"], job["workers"])
    nodes.add_metric(["server"], job["servers"])
    yield nodes
    yield CounterMetricFamily("ps_job_restarts", "Restarted nodes the job admitted.", value=job["restarts"])
    if job["steps_per_second"] is not None:
        yield GaugeMetricFamily("ps_job_steps_per_second", "The job's training steps per second (the median "
                                "worker's, over the last second).", value=job["steps_per_second"])
    if job["step"] is not None:
        yield GaugeMetricFamily("ps_job_step", "The median worker's step.", value=job["step"])
    yield GaugeMetricFamily("ps_job_stalls", "Stalls now: sync rounds and barriers waiting past "
                            "PS_STALL_WARNING.", value=len(state["stalls"]))


def registry(view: JobView, facts: Callable[[], JobFacts]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(JobCollector(view, facts))
    return reg
