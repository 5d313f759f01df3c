"""A process declared dead is not heard by the other nodes either, only by nobody.

A network partition leaves a worker running while the job declares it dead and starts it
again elsewhere; when the link comes back its old process speaks again. A server that heard
it took the old process's connection as the worker's, and the restart's next replies went
there: the restart waited for them forever (found by
tests/launcher/test_launcher_multihost.py's partition test, 1 run in a few). A real
scheduler and a real KVServer on 127.0.0.1; the workers are bare vans that register and ask
the server a command, so the test decides who speaks when."""
import threading

import pytest

from ps.config import Config
from ps.message import SCHEDULER, Command, Message, Node, Role
from ps.server import KVServer
from tests.helpers import wait_for
from tests.integration import test_scheduler_formation as formation
from tests.integration.test_scheduler_formation import FakeNode, _formed

cluster = formation.cluster         # its fixture: a scheduler on 127.0.0.1

pytestmark = pytest.mark.process


def _ask(node: FakeNode, me: int, server: int, cid: int) -> None:
    node.van.send(Message(Command.SERVER_CMD, me, server, {"id": cid, "cmd": "stats"}))


def _answered(node: FakeNode, cid: int) -> bool:
    return any(m.cmd == Command.SERVER_CMD and isinstance(m.body, dict) and m.body.get("id") == cid
               for m in node.got)


@pytest.mark.timeout(60)
def test_a_server_does_not_hear_a_process_declared_dead_but_hears_its_restart(cluster):
    port, nodes = cluster(PS_MAX_RESTARTS="2", PS_HEARTBEAT_INTERVAL="0.2", PS_HEARTBEAT_TIMEOUT="1.5")
    env = {"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_MAX_RESTARTS": "2",
           "PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "1.5", "PS_CONNECT_TIMEOUT": "30"}
    server = KVServer(Config.from_env(env))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    old, other = FakeNode(port, Role.WORKER), FakeNode(port, Role.WORKER)
    nodes += [old, other]
    beating: set[FakeNode] = set()
    stop = threading.Event()

    def beat():
        while not stop.wait(0.2):
            for n in list(beating):
                n.van.send(Message(Command.HEARTBEAT, ids[n], SCHEDULER))
    try:
        ids = _formed([old, other])
        beating.update((old, other))
        threading.Thread(target=beat, daemon=True).start()
        for n in (old, other):      # the server serves once every node passed the first barrier
            n.van.send(Message(Command.BARRIER, ids[n], SCHEDULER, {"group": "all"}))
        table = next(m.body for m in other.got if m.cmd == Command.NODE_TABLE)
        sid, addr = next((n.node_id, n.addr) for n in map(Node.from_row, table["nodes"]) if n.role == Role.SERVER)
        for n in (old, other):
            n.van.connect(sid, addr)
        _ask(old, ids[old], sid, 1)
        wait_for(lambda: _answered(old, 1), 10, what="the server's answer to the worker while it lives")
        beating.discard(old)            # a partition: it runs, but nothing of it arrives
        wait_for(lambda: Command.NODE_DOWN in other.cmds(), 10, what="the silent worker declared dead")
        down = next(m.body for m in other.got if m.cmd == Command.NODE_DOWN)
        assert down["id"] == ids[old] and isinstance(down["identity"], bytes), down
        other.van.send(Message(Command.NODE_DOWN, ids[other], SCHEDULER, {"id": ids[old], "death": down["death"]},
                               request=False))

        restart = FakeNode(port, Role.WORKER)
        nodes.append(restart)
        restart.register()
        wait_for(lambda: Command.NODE_TABLE in restart.cmds(), 10,
                 what="the restart's node table (the server acknowledged the death)")
        ids[restart] = ids[old]
        beating.add(restart)
        restart.van.send(Message(Command.BARRIER, ids[old], SCHEDULER, {"group": "all"}))
        restart.van.connect(sid, addr)
        _ask(old, ids[old], sid, 2)                 # the old process speaks again
        _ask(restart, ids[old], sid, 3)
        wait_for(lambda: _answered(restart, 3), 10, what="the server's answer to the restart")
        _ask(old, ids[old], sid, 4)
        _ask(restart, ids[old], sid, 5)
        wait_for(lambda: _answered(restart, 5), 10, what="the server's second answer to the restart")
        assert not _answered(old, 2) and not _answered(old, 4), [m.body for m in old.got if m.cmd == Command.SERVER_CMD]
    finally:
        stop.set()
        server.stop()
        serving.join(10)
