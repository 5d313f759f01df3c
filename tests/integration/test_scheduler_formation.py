"""The scheduler before formation: who takes the place of a node it cannot reach.

A real Scheduler on 127.0.0.1, and nodes that register over real ZeroMQ vans: live ones
announce their van's own address, dead ones a port nobody listens on (a node that died at
once after registering: the scheduler's watch finds its port closed)."""
import threading
import time

import pytest

from ps.config import Config
from ps.message import Command, Message, Node, Role
from ps.netutil import free_port
from ps.scheduler import SCHEDULER, Scheduler
from ps.van import create_van
from tests.helpers import wait_for

pytestmark = pytest.mark.process


class FakeNode:
    """Registers like a node and records what the scheduler sends it."""

    def __init__(self, sched_port: int, role: Role, dead: bool = False, host: str = "127.0.0.1"):
        self.got: list[Message] = []
        self.host = host
        self.van = create_van("zmq")
        own = self.van.start(self.got.append, "127.0.0.1", name=f"fake-{role.name.lower()}")
        self.van.connect(SCHEDULER, f"tcp://127.0.0.1:{sched_port}")
        self.role = role
        self.addr = f"tcp://127.0.0.1:{free_port()}" if dead else own

    def register(self, **said) -> None:
        """``said``: more of what a registration says (a worker's "sync", "chunk")."""
        port = int(self.addr.rsplit(":", 1)[1])
        self.van.send(Message(Command.ADD_NODE, 0, SCHEDULER, {
            "role": int(self.role), "host": self.host, "port": port, "addr": self.addr, **said}))

    def cmds(self) -> list[Command]:
        return [m.cmd for m in self.got]


@pytest.fixture
def cluster():
    """``start(connect_timeout)`` runs a scheduler for 2 workers and 1 server; returns
    ``(port, nodes)``: FakeNodes appended to ``nodes`` are stopped at the end."""
    started: list[tuple[Scheduler, threading.Thread]] = []
    nodes: list[FakeNode] = []

    def start(connect_timeout: float = 30, **extra: str) -> tuple[int, list[FakeNode]]:
        port = free_port()
        env = {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
               "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_CONNECT_TIMEOUT": str(connect_timeout), **extra}
        sched = Scheduler(Config.from_env(env))
        sched.start()
        thread = threading.Thread(target=sched.run, daemon=True)
        thread.start()
        started.append((sched, thread))
        return port, nodes

    yield start
    for sched, thread in started:
        sched.close()
        thread.join(10)
    for n in nodes:
        n.van.stop()


def _registered(node: FakeNode, **said) -> FakeNode:
    node.register(**said)
    wait_for(lambda: Command.ADD_NODE in node.cmds(), 10, what=f"the registration of {node.addr}")
    return node


def _formed(nodes: list[FakeNode], **said) -> dict[FakeNode, int]:
    """Register ``nodes`` (the workers saying ``said``), wait for each one's node table; their
    node ids."""
    for n in nodes:
        _registered(n, **(said if n.role == Role.WORKER else {}))
    ids = {}
    for n in nodes:
        wait_for(lambda n=n: Command.NODE_TABLE in n.cmds(), 10, what=f"the node table at {n.addr}")
        ids[n] = next(m.body["you"] for m in n.got if m.cmd == Command.NODE_TABLE)
    return ids


def _reason(node: FakeNode) -> str:
    wait_for(lambda: Command.ABORT in node.cmds(), 15, what=f"an ABORT to {node.addr}")
    return next(m.body["reason"] for m in node.got if m.cmd == Command.ABORT)


@pytest.mark.timeout(60)
def test_each_registration_for_a_full_role_takes_one_dead_nodes_place_and_tells_it(cluster):
    """Two workers register and die at once (their ports refuse the scheduler's watch); a
    third registration takes one place (the oldest's), not both, and the dead node is told
    why; a fourth takes the other; the cluster forms with the live ones."""
    port, nodes = cluster()
    first, second = (_registered(FakeNode(port, Role.WORKER, dead=True)) for _ in range(2))
    nodes += [first, second]
    time.sleep(0.3)                     # the watch found both ports closed
    third = FakeNode(port, Role.WORKER)
    nodes.append(third)
    _registered(third)
    reason = _reason(first)
    assert first.addr in reason and third.addr in reason and "took its place" in reason, reason
    assert Command.ABORT not in second.cmds()
    fourth, server = FakeNode(port, Role.WORKER), FakeNode(port, Role.SERVER)
    nodes += [fourth, server]
    _registered(fourth)
    assert fourth.addr in _reason(second)
    _registered(server)
    for n in (third, fourth, server):
        wait_for(lambda n=n: Command.NODE_TABLE in n.cmds(), 10, what=f"the node table at {n.addr}")
    table = [Node.from_row(row) for row in next(m.body for m in third.got if m.cmd == Command.NODE_TABLE)["nodes"]]
    assert sorted(n.addr for n in table if n.role == Role.WORKER) == sorted([third.addr, fourth.addr])


@pytest.mark.timeout(60)
def test_a_dead_registration_holds_formation_back_and_the_timeout_names_it(cluster):
    """A worker that registered and died is not formed into the cluster: formation waits,
    the node is dropped after 2 s, and the formation timeout names it and who was dropped."""
    port, nodes = cluster(connect_timeout=4)
    dead = FakeNode(port, Role.WORKER, dead=True)
    live, server = FakeNode(port, Role.WORKER), FakeNode(port, Role.SERVER)
    nodes += [dead, live, server]
    for n in (dead, live, server):
        _registered(n)
    time.sleep(0.5)
    assert Command.NODE_TABLE not in live.cmds()        # 2 workers registered, but one is dead
    reason = _reason(live)
    assert "PS_CONNECT_TIMEOUT" in reason and "1/2 workers" in reason, reason
    assert f"dropped before formation: the worker from {dead.addr} (refused connections)" in reason, reason


@pytest.mark.timeout(60)
def test_a_restart_gets_its_table_only_once_the_others_acted_on_its_death(cluster):
    """PS_MAX_RESTARTS: a worker dies after formation; its restart registers, but is given its
    node table (and so talks to the servers) only once every live node has acknowledged the
    NODE_DOWN. Before, with PS_RESEND and a lost NODE_DOWN resent late, the restart's first
    messages reached a server before the news of the death, which then wiped them: a hang."""
    port, nodes = cluster(PS_MAX_RESTARTS="2")
    dead, live, server = FakeNode(port, Role.WORKER), FakeNode(port, Role.WORKER), FakeNode(port, Role.SERVER)
    nodes += [dead, live, server]
    ids = _formed([dead, live, server])
    dead.van.stop()                                      # the scheduler's watch sees it close
    for n in (live, server):
        wait_for(lambda n=n: Command.NODE_DOWN in n.cmds(), 10, what=f"the NODE_DOWN at {n.addr}")
    restart = FakeNode(port, Role.WORKER)
    nodes.append(restart)
    restart.register()
    time.sleep(1.0)
    assert Command.NODE_TABLE not in restart.cmds(), "the restart was admitted before the others knew"
    for n in (live, server):
        death = next(m.body["death"] for m in n.got if m.cmd == Command.NODE_DOWN)
        n.van.send(Message(Command.NODE_DOWN, ids[n], SCHEDULER, {"id": ids[dead], "death": death - 1}, request=False))
    time.sleep(0.5)
    assert Command.NODE_TABLE not in restart.cmds(), "an acknowledgement of another death admitted the restart"
    for n in (live, server):
        death = next(m.body["death"] for m in n.got if m.cmd == Command.NODE_DOWN)
        n.van.send(Message(Command.NODE_DOWN, ids[n], SCHEDULER, {"id": ids[dead], "death": death}, request=False))
    wait_for(lambda: Command.NODE_TABLE in restart.cmds(), 3, what="the restart's node table after the acks")
    table = next(m.body for m in restart.got if m.cmd == Command.NODE_TABLE)
    assert table["you"] == ids[dead] and table["restart"] == 1


@pytest.mark.timeout(60)
def test_a_restart_that_cuts_keys_differently_or_asks_for_another_type_is_refused_and_the_right_one_joins(cluster):
    """The workers formed with PS_CHUNK_BYTES=256K, which every node table carries (a
    restarted scheduler learns it back from the nodes' reports). A dead worker's restart with
    1 MiB chunks would push chunks no server sums with the others', and one asking for
    dist_async another kind of job: each is told why and is not admitted; the restart that
    matches takes the place."""
    port, nodes = cluster(PS_MAX_RESTARTS="2")
    dead, live, server = FakeNode(port, Role.WORKER), FakeNode(port, Role.WORKER), FakeNode(port, Role.SERVER)
    nodes += [dead, live, server]
    ids = _formed([dead, live, server], sync=True, chunk=256 << 10)
    assert {next(m.body["chunk"] for m in n.got if m.cmd == Command.NODE_TABLE) for n in ids} == {256 << 10}
    dead.van.stop()
    for n in (live, server):
        wait_for(lambda n=n: Command.NODE_DOWN in n.cmds(), 10, what=f"the NODE_DOWN at {n.addr}")
        death = next(m.body["death"] for m in n.got if m.cmd == Command.NODE_DOWN)
        n.van.send(Message(Command.NODE_DOWN, ids[n], SCHEDULER, {"id": ids[dead], "death": death}, request=False))
    big, unsynced, right = (FakeNode(port, Role.WORKER) for _ in range(3))
    nodes += [big, unsynced, right]
    big.register(sync=True, chunk=1 << 20)
    assert _reason(big) == (f"the worker restarting from {big.addr} has PS_CHUNK_BYTES=1048576, and the job's "
                            "workers 262144: a server sums the same chunks of every worker; restart it with "
                            "PS_CHUNK_BYTES=262144")
    unsynced.register(sync=False, chunk=256 << 10)
    assert _reason(unsynced) == (f"the worker restarting from {unsynced.addr} asked for dist_async, and the job "
                                 "is dist_sync; every worker must create the same type")
    right.register(sync=True, chunk=256 << 10)
    wait_for(lambda: Command.NODE_TABLE in right.cmds(), 5, what="the matching restart's node table")
    assert next(m.body["you"] for m in right.got if m.cmd == Command.NODE_TABLE) == ids[dead]
    assert Command.NODE_TABLE not in big.cmds() + unsynced.cmds()


@pytest.mark.timeout(60)
def test_the_replica_ring_puts_neighbours_on_different_hosts_and_a_restart_gets_the_same_ring(cluster):
    """Four servers started by hand on two hosts, no DMLC_RANK: ranks are sorted by host, so
    ranks 0-1 share a host and 2-3 the other. In rank order the ring would make servers of one
    host neighbours (a dead host: one server's only copy lost with it); every node gets the
    interleaved ring, and a restart the same one, wherever it runs now."""
    port, nodes = cluster(PS_MAX_RESTARTS="2", DMLC_NUM_SERVER="4", DMLC_NUM_WORKER="1")
    servers = [FakeNode(port, Role.SERVER, host=h) for h in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3")]
    worker = FakeNode(port, Role.WORKER)
    nodes += [*servers, worker]
    for n in (*servers, worker):
        _registered(n)
    tables = {}
    for n in (*servers, worker):
        wait_for(lambda n=n: Command.NODE_TABLE in n.cmds(), 10, what=f"the node table at {n.addr}")
        tables[n] = next(m.body for m in n.got if m.cmd == Command.NODE_TABLE)
    assert {t["ring"] == tables[worker]["ring"] for t in tables.values()} == {True}
    ring = tables[worker]["ring"]
    assert sorted(ring) == [0, 1, 2, 3], ring
    by_rank = {tables[s]["you"]: s.host for s in servers}
    assert len(set(by_rank.values())) == 2
    host_of = [by_rank[8 + 2 * r] for r in range(4)]
    assert host_of[0] == host_of[1] and host_of[2] == host_of[3], host_of    # ranks sorted by host
    assert all(host_of[ring[i]] != host_of[ring[(i + 1) % 4]] for i in range(4)), (ring, host_of)

    dead = servers[0]
    dead_id = tables[dead]["you"]
    dead.van.stop()
    for n in (*servers[1:], worker):
        wait_for(lambda n=n: Command.NODE_DOWN in n.cmds(), 10, what=f"the NODE_DOWN at {n.addr}")
        down = next(m.body for m in n.got if m.cmd == Command.NODE_DOWN)
        assert down["incarnation"] == 0
        n.van.send(Message(Command.NODE_DOWN, tables[n]["you"], SCHEDULER, {"id": dead_id, "death": down["death"]},
                           request=False))
    restart = FakeNode(port, Role.SERVER, host="127.0.0.4")
    nodes.append(restart)
    restart.register()
    wait_for(lambda: Command.NODE_TABLE in restart.cmds(), 3, what="the restart's node table")
    table = next(m.body for m in restart.got if m.cmd == Command.NODE_TABLE)
    assert table["you"] == dead_id and table["ring"] == ring


@pytest.mark.timeout(60)
def test_a_process_declared_dead_is_told_to_stop_and_never_heard_again(cluster):
    """A worker stops beating (a long pause, a partition) and is declared dead; when it speaks
    again it is told to stop (ABORT naming the reason), once, and its messages are not heard:
    its heartbeats would have been answered as if nothing happened, and after its restart was
    admitted one of them would have taken the restart's route, so news meant for the restart
    (here: another worker's death) went to the old process instead."""
    port, nodes = cluster(PS_MAX_RESTARTS="2", PS_HEARTBEAT_INTERVAL="0.2", PS_HEARTBEAT_TIMEOUT="1.5")
    old, other, server = FakeNode(port, Role.WORKER), FakeNode(port, Role.WORKER), FakeNode(port, Role.SERVER)
    nodes += [old, other, server]
    ids = _formed([old, other, server])
    beating = {other, server}
    stop = threading.Event()

    def beat():
        while not stop.wait(0.2):
            for n in list(beating):
                n.van.send(Message(Command.HEARTBEAT, ids[n], SCHEDULER))
    threading.Thread(target=beat, daemon=True).start()
    try:
        wait_for(lambda: Command.NODE_DOWN in other.cmds(), 10, what="the silent worker declared dead")
        for n in (other, server):
            death = next(m.body["death"] for m in n.got if m.cmd == Command.NODE_DOWN)
            n.van.send(Message(Command.NODE_DOWN, ids[n], SCHEDULER, {"id": ids[old], "death": death}, request=False))
        old.van.send(Message(Command.HEARTBEAT, ids[old], SCHEDULER))
        wait_for(lambda: Command.ABORT in old.cmds(), 5, what="the old process told to stop")
        reason = next(m.body["reason"] for m in old.got if m.cmd == Command.ABORT)
        assert "declared dead" in reason and "sent no heartbeat" in reason and "must stop" in reason, reason
        assert Command.HEARTBEAT not in old.cmds()          # not answered as if nothing happened

        restart = FakeNode(port, Role.WORKER)
        nodes.append(restart)
        restart.register()
        wait_for(lambda: Command.NODE_TABLE in restart.cmds(), 10, what="the restart's node table")
        ids[restart] = ids[old]
        beating.add(restart)
        for _ in range(3):
            old.van.send(Message(Command.HEARTBEAT, ids[old], SCHEDULER))
        time.sleep(0.5)
        assert sum(m.cmd == Command.ABORT for m in old.got) == 1
        beating.discard(other)                               # now the other worker goes silent
        wait_for(lambda: sum(m.cmd == Command.NODE_DOWN for m in restart.got) >= 1, 10,
                 what="the other worker's death told to the restart, not to the old process")
        assert [m.body["id"] for m in restart.got if m.cmd == Command.NODE_DOWN] == [ids[other]]
        assert sum(m.cmd == Command.NODE_DOWN for m in old.got) == 0
    finally:
        stop.set()
