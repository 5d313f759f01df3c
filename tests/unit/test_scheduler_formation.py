"""The scheduler before formation: who takes the place of a node it cannot reach.

A real Scheduler on 127.0.0.1, and nodes that register over real ZeroMQ vans but announce a
listening address nobody listens on, so the scheduler's watch never reaches them (a firewall,
a node that died at once)."""
import threading
import time

import pytest

from ps.config import Config
from ps.message import Command, Message, Node, Role
from ps.netutil import free_port
from ps.scheduler import SCHEDULER, Scheduler
from ps.van import create_van
from tests.helpers import wait_for


class FakeNode:
    """Registers like a node and records what the scheduler sends it."""

    def __init__(self, sched_port: int, role: Role):
        self.got: list[Message] = []
        self.van = create_van("zmq")
        self.van.start(self.got.append, "127.0.0.1", name=f"fake-{role.name.lower()}")
        self.van.connect(SCHEDULER, f"tcp://127.0.0.1:{sched_port}")
        self.role = role
        self.addr = f"tcp://127.0.0.1:{free_port()}"    # nobody listens there

    def register(self) -> None:
        port = int(self.addr.rsplit(":", 1)[1])
        self.van.send(Message(Command.ADD_NODE, 0, SCHEDULER, {
            "role": int(self.role), "host": "127.0.0.1", "port": port, "addr": self.addr}))

    def cmds(self) -> list[Command]:
        return [m.cmd for m in self.got]


@pytest.fixture
def cluster():
    """``start(connect_timeout)`` runs a scheduler for 2 workers and 1 server; returns
    ``(port, nodes)``: FakeNodes appended to ``nodes`` are stopped at the end."""
    started: list[tuple[Scheduler, threading.Thread]] = []
    nodes: list[FakeNode] = []

    def start(connect_timeout: float = 30) -> tuple[int, list[FakeNode]]:
        port = free_port()
        env = {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
               "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_CONNECT_TIMEOUT": str(connect_timeout)}
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


def _replace_first_of_two_unreached_workers(port: int, nodes: list[FakeNode]) -> list[FakeNode]:
    first, second, third = (FakeNode(port, Role.WORKER) for _ in range(3))
    nodes += [first, second, third]
    first.register()
    wait_for(lambda: Command.ADD_NODE in first.cmds(), 10, what="the first worker's registration")
    time.sleep(0.2)
    second.register()
    wait_for(lambda: Command.ADD_NODE in second.cmds(), 10, what="the second worker's registration")
    time.sleep(1.2)                     # both unreached for more than 1 s
    third.register()
    wait_for(lambda: Command.ADD_NODE in third.cmds(), 10, what="the third worker's registration")
    return [first, second, third]


@pytest.mark.timeout(60)
def test_a_registration_for_a_full_role_takes_one_unreached_place_and_tells_its_owner(cluster):
    """Two workers the scheduler cannot reach, then a third: one place is given up (the
    oldest's, and its owner gets an ABORT saying why), not every unreached worker's place."""
    port, nodes = cluster()
    first, second, third = _replace_first_of_two_unreached_workers(port, nodes)
    wait_for(lambda: Command.ABORT in first.cmds(), 10, what="the ABORT to the replaced worker")
    reason = next(m.body["reason"] for m in first.got if m.cmd == Command.ABORT)
    assert first.addr in reason and third.addr in reason and "took its place" in reason, reason
    server = FakeNode(port, Role.SERVER)
    nodes.append(server)
    server.register()
    for n in (second, third, server):
        wait_for(lambda n=n: Command.NODE_TABLE in n.cmds(), 10, what=f"the node table at {n.addr}")
    table = [Node.from_row(row) for row in next(m.body for m in third.got if m.cmd == Command.NODE_TABLE)["nodes"]]
    assert Command.ABORT not in second.cmds()
    assert sorted(n.addr for n in table if n.role == Role.WORKER) == sorted([second.addr, third.addr])


@pytest.mark.timeout(60)
def test_the_formation_timeout_names_the_nodes_dropped_before_it(cluster):
    port, nodes = cluster(connect_timeout=3)
    first, second, third = _replace_first_of_two_unreached_workers(port, nodes)
    for n in (second, third):           # no server ever registers
        wait_for(lambda n=n: Command.ABORT in n.cmds(), 15, what=f"the formation timeout's ABORT at {n.addr}")
    reason = next(m.body["reason"] for m in third.got if m.cmd == Command.ABORT)
    assert "PS_CONNECT_TIMEOUT" in reason and "0/1 servers" in reason, reason
    assert f"dropped before formation: the worker from {first.addr}" in reason, reason
