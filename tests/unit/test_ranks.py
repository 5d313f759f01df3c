"""Rank assignment by the scheduler: pinned ranks first, the rest as ps-lite orders them."""
from ps.message import Role
from ps.membership import Member, assign_ranks, placement_warning


def node(host, port, hint=None):
    return Member(Role.WORKER, host, port, f"tcp://{host}:{port}", rank_hint=hint)


def addrs(nodes):
    return [n.addr for n in nodes]


def test_unpinned_nodes_go_by_host_descending_then_port_ascending():
    nodes = [node("10.0.0.1", 9001), node("10.0.0.2", 9002), node("10.0.0.2", 9001), node("10.0.0.1", 9000)]
    assert addrs(assign_ranks(nodes)) == ["tcp://10.0.0.2:9001", "tcp://10.0.0.2:9002",
                                          "tcp://10.0.0.1:9000", "tcp://10.0.0.1:9001"]


def test_the_order_does_not_depend_on_registration_order():
    nodes = [node("h1", 5), node("h2", 3), node("h1", 4), node("h3", 1)]
    assert addrs(assign_ranks(nodes)) == addrs(assign_ranks(list(reversed(nodes))))


def test_valid_hints_pin_ranks_and_the_rest_fill_the_gaps():
    nodes = [node("a", 1), node("b", 2, hint=0), node("c", 3, hint=2), node("d", 4)]
    ranked = assign_ranks(nodes)
    assert ranked[0].host == "b" and ranked[2].host == "c"
    assert [n.host for n in (ranked[1], ranked[3])] == ["d", "a"]     # host descending


def test_out_of_range_and_duplicate_hints_are_ignored():
    nodes = [node("a", 1, hint=5), node("b", 2, hint=1), node("c", 3, hint=1), node("d", 4, hint=-1)]
    ranked = assign_ranks(nodes)
    assert ranked[1].host == "b"                       # the first to claim rank 1 keeps it
    assert sorted(n.host for n in ranked) == ["a", "b", "c", "d"]
    assert [ranked[i].host for i in (0, 2, 3)] == ["d", "c", "a"]


def test_fewer_server_hosts_than_worker_hosts_is_warned_of():
    def member(role, host):
        return Member(role, host, 9000, f"tcp://{host}:9000")
    workers = [member(Role.WORKER, f"10.0.0.{i}") for i in (1, 2, 3, 4)]
    one_server = [member(Role.SERVER, "10.0.0.1")]
    text = placement_warning(workers + one_server)
    assert text.startswith("workers run on 4 hosts, servers on only 1 (10.0.0.1)"), text
    assert "How many servers?" in text
    # one server per worker host, dedicated server hosts, or everything on one machine: silent
    assert placement_warning(workers + [member(Role.SERVER, w.host) for w in workers]) is None
    assert placement_warning(workers + [member(Role.SERVER, f"10.0.1.{i}") for i in range(4)]) is None
    assert placement_warning([member(Role.WORKER, "127.0.0.1")] * 4 + one_server) is None
    two_per_host = [member(Role.SERVER, h) for h in ("10.0.0.1", "10.0.0.2")] * 2
    assert "servers on only 2 (10.0.0.1, 10.0.0.2)" in placement_warning(workers + two_per_host)
