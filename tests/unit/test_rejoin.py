"""A restarted scheduler's rules, without processes: the live nodes' reports (ps/rejoin.py),
what the rebuild makes of them (ps/rebuild.py), the barriers it restores (ps/barriers.py),
the job's end (ps/ending.py) and the periodic check that finds the nodes that did not
report dead (membership.find_death)."""
import itertools

import pytest

from ps.barriers import Barriers
from ps.ending import Ending
from ps.membership import Member, Recovery, find_death
from ps.message import Command, Node, Role, server_id, worker_id
from ps.rebuild import Rebuild
from ps.rejoin import Rejoin

S0, S1, W0, W1 = server_id(0), server_id(1), worker_id(0), worker_id(1)


def table():
    return [Node(S0, Role.SERVER, 0, "h", 1, "tcp://h:1"), Node(S1, Role.SERVER, 1, "h", 2, "tcp://h:2"),
            Node(W0, Role.WORKER, 0, "h", 3, "tcp://h:3"), Node(W1, Role.WORKER, 1, "h", 4, "tcp://h:4")]


def report(node_id, **kw):
    return Rejoin(node_id, 0, table(), True, [0, 1], 0, **kw)


def test_a_report_round_trips_through_its_message_body():
    r = report(W1, down={S1: "died"}, closed_workers=[W0], waiting=["workers"], passed={"all": 1, "workers": 3},
               recovering=True, closed=True, chunk=256 << 10)
    assert Rejoin.from_body(r.to_body()) == r
    older = r.to_body()
    del older["chunk"]              # a node of a ps that did not report it: none said
    assert Rejoin.from_body(older).chunk == 0


@pytest.mark.parametrize("body,says", [
    ("nope", "not a map"),
    ({"id": W0}, "malformed rejoin report (KeyError"),
    ({**report(W0).to_body(), "id": 99}, "from node 99, which its own node table lacks"),
    ({**report(W0).to_body(), "nodes": [[1, 2, 0, "h", 1, "tcp://h:1"]]}, "from node 9, which its own node table"),
])
def test_a_malformed_report_is_refused_naming_what_is_wrong(body, says):
    with pytest.raises(ValueError) as err:
        Rejoin.from_body(body)
    assert says in str(err.value)


def test_reports_of_another_job_disagree():
    other = Rejoin(W0, 0, table()[:3], True, [0, 1], 0)
    assert report(W1).agrees(other) == "their node tables name different nodes"
    assert report(W1).agrees(Rejoin(W0, 0, table(), False, [0, 1], 0)) == "one is dist_sync and the other dist_async"
    assert report(W1, chunk=1 << 20).agrees(report(W0, chunk=128 << 10)) == \
        "one says PS_CHUNK_BYTES=1048576 and the other 131072"
    assert report(W1, chunk=1 << 20).agrees(report(W0)) is None
    assert report(W1).agrees(report(W0)) is None


class Job:
    """A scheduler's collaborators as a rebuild sees them, recording what it sends."""

    def __init__(self):
        self.sent = []
        self.nodes = {}
        self.recovering = {}
        self.barriers = Barriers(lambda: 0.0, 0, lambda g: [i for i, n in self.nodes.items()
                                                            if g == "all" or n.role.name.lower() + "s" == g],
                                 set(), str, lambda i, c, b=None: self.sent.append((i, c, b)))
        self.rebuild = Rebuild(lambda: 5.0, lambda: self.nodes, self.recovering, self.barriers,
                               lambda i, c, b=None, r=False: self.sent.append((i, c, b)),
                               lambda i: {"row": i}, itertools.count(1))


def test_the_first_report_gives_the_job_and_every_node_is_awaited():
    job = Job()
    early = Member(Role.WORKER, "h", 9, "tcp://h:9")
    job.nodes = job.rebuild.begin(report(W0), 5.0, [early])
    assert sorted(job.nodes) == sorted([S0, S1, W0, W1]) and job.nodes[W1].rank == 1
    assert job.rebuild.unreported == {S0, S1, W0, W1}
    assert job.rebuild.early == [(early, None)]
    assert job.rebuild.accept(Rejoin(W1, 1, table()[1:], True, [0, 1], 0).to_body(), 3, 1, 2).startswith(
        "it is not of the job the first report described")
    assert job.rebuild.accept(report(W1).to_body(), 0, 2, 2) == "this scheduler runs without PS_MAX_RESTARTS"
    assert job.rebuild.accept(report(W1).to_body(), 3, 2, 2) == report(W1)
    assert job.rebuild.accept(report(W1).to_body(), 3, 2, 4) == (
        "its node table has 2 servers and 2 workers; this scheduler's job has 2 and 4 (DMLC_NUM_SERVER, "
        "DMLC_NUM_WORKER)")


def test_news_for_an_unreported_node_is_held_until_it_reports():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    assert job.rebuild.hold(S1, Command.TERMINATE, None, True)
    assert job.rebuild.reported(S1) == [(Command.TERMINATE, None, True)]
    assert not job.rebuild.hold(S1, Command.STALL, "x", False)
    assert job.rebuild.dead(W1) is True and W1 not in job.rebuild.unreported
    assert job.rebuild.dead(S1) is False        # it had reported: not one that died with the old scheduler


def test_a_node_one_report_names_down_is_awaited_and_the_others_are_told():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    job.rebuild.reported(W0)
    job.rebuild.news(W0, report(W0, down={S1: "S[10] died"}))
    assert job.recovering[S1].reason == "S[10] died" and not job.recovering[S1].replaced
    job.rebuild.reported(W1)
    job.rebuild.news(W1, report(W1))            # it missed the news
    assert (W1, Command.NODE_DOWN, {"id": S1, "reason": "S[10] died", "death": 1, "incarnation": 0,
                                    "identity": None}) in job.sent     # (its process never reported)
    assert W1 in job.recovering[S1].unacked


def test_a_node_named_down_that_reports_alive_is_announced_back_up():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    job.rebuild.reported(W0)
    job.rebuild.news(W0, report(W0, down={S1: "died"}))
    job.rebuild.reported(S1)
    job.rebuild.news(S1, report(S1))            # it had recovered and said so to the old scheduler
    assert S1 not in job.recovering
    assert (W0, Command.NODE_UP, {"row": S1}) in job.sent
    job.sent.clear()
    job.rebuild.reported(W1)
    job.rebuild.news(W1, report(W1, down={S1: "died"}))     # a late reporter still thinks so
    assert job.sent == [(W1, Command.NODE_UP, {"row": S1})] and S1 not in job.recovering


def test_a_restart_still_recovering_is_counted_replaced():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    job.rebuild.news(S1, report(S1, recovering=True))
    assert job.recovering[S1].replaced


def test_a_barrier_released_by_the_dead_scheduler_is_answered_at_once():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    job.barriers.rejoin(W0, {"workers": 3}, [])             # passed the 3rd workers barrier
    job.barriers.rejoin(W1, {"workers": 2}, ["workers"])    # its release was lost with the scheduler
    assert job.sent == [(W1, Command.BARRIER, {"group": "workers", "error": None})]


def test_a_barrier_still_open_waits_for_every_member_and_a_dead_ones_count_is_estimated():
    job = Job()
    job.nodes = job.rebuild.begin(report(W0), 5.0, [])
    job.barriers.rejoin(W0, {"all": 1, "workers": 2}, ["workers"])
    assert job.sent == []
    job.barriers.rejoin(W1, {"all": 1, "workers": 2}, ["workers"])
    assert sorted(s[0] for s in job.sent) == [W0, W1]   # released together
    job.barriers.rejoin(S0, {"all": 1}, [])
    job.barriers.estimate(S1, ["all", "servers"], set())
    job.barriers.replay(S1)
    job.sent.clear()
    job.barriers.arrive(S1, "all")              # its restart's start barrier: its dead self passed it
    assert job.sent == [(S1, Command.BARRIER, {"group": "all", "error": None})]


def test_a_dead_nodes_count_counts_the_members_that_reported_after_it_was_found_dead():
    """Worker 1 died with the old scheduler and was found dead before worker 0, the other
    member of 'workers', reported: its restart's replay must still count worker 0's barriers,
    or its first 'workers' barrier waits for worker 0, who is long past it (a hang seen in
    test_the_scheduler_and_another_node_killed_at_once_lose_nothing)."""
    job = Job()
    job.nodes = job.rebuild.begin(report(S0), 5.0, [])
    job.barriers.rejoin(S0, {"all": 1}, [])
    job.barriers.estimate(W1, ["all", "workers"], {W0, S1})      # found dead: worker 0 has not reported
    job.barriers.rejoin(W0, {"all": 1, "workers": 2}, [])
    job.barriers.rejoin(S1, {"all": 1}, [])
    job.barriers.replay(W1)                                       # its restart is admitted
    job.sent.clear()
    job.barriers.arrive(W1, "all")
    job.barriers.arrive(W1, "workers")
    job.barriers.arrive(W1, "workers")
    assert job.sent == [(W1, Command.BARRIER, {"group": g, "error": None}) for g in ("all", "workers", "workers")]
    job.sent.clear()
    job.barriers.arrive(W1, "workers")                            # a new one: it waits for worker 0
    assert job.sent == []


def test_the_job_ends_once_every_worker_closed_even_when_one_reports_it_to_a_restart():
    sent, finished = [], []
    ending = Ending(lambda: 0.0, 2, lambda i: {W0: 0, W1: 1}[i], lambda: [S0, S1],
                    lambda i, c, b=None, request=False: sent.append((i, c)), finished.append)
    ending.report(S0, [W0], False, {S0, S1, W0, W1})     # a server knew worker 0 had closed
    assert ending.closed_workers == {W0} and (S0, Command.TERMINATE) not in sent
    ending.report(W1, [], True, {S0, S1, W0, W1})         # worker 1 closed; its CLOSE died with the scheduler
    assert (S0, Command.WORKER_CLOSED) in sent and (W1, Command.CLOSE) in sent
    assert (S0, Command.TERMINATE) in sent and (S1, Command.TERMINATE) in sent
    ending.server_ended(S0)
    assert finished == []
    ending.server_ended(S1)
    assert finished == [0]


def test_find_death_names_a_node_that_did_not_report_within_the_heartbeat_timeout():
    nodes = {W0: Member(Role.WORKER, "h", 3, "tcp://h:3", rank=0, last_seen=0.0),
             W1: Member(Role.WORKER, "h", 4, "tcp://h:4", rank=1, last_seen=8.0)}
    assert find_death(9.0, nodes, {}, {}, lambda i: True, 120, 10, 2) is None
    death = find_death(11.0, nodes, {}, {}, lambda i: True, 120, 10, 2)
    assert death.node_id == W0 and "sent no heartbeat for 11.0s (PS_HEARTBEAT_TIMEOUT=10)" in death.reason
    assert not death.final
    assert find_death(11.0, nodes, {}, {W1: 5.0}, lambda i: i == W1, 120, 10, 2).reason.startswith(
        "worker 1 (W[11] at h:4) closed its connection")
    late = find_death(200.0, nodes, {W1: Recovery(0.0, "died")}, {}, lambda i: False, 120, 10, 2)
    assert late.final and "was not restarted within 120s (PS_CONNECT_TIMEOUT)" in late.reason
