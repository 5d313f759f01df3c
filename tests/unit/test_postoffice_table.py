"""A restarted worker learns of a restarted server twice: its node table (made when the
scheduler admitted it) and that server's NODE_UP. The I/O thread can handle the NODE_UP
before the main thread adopts the table; the table must then not put the dead server's address
back (every request to that server went to the dead process, and the worker's recovery waited
out PS_CONNECT_TIMEOUT: the flaky test_servers_that_are_not_ring_neighbours_recover_together)."""
import threading

from ps.config import Config
from ps.message import Command, Message, Node, Role, server_id, worker_id
from ps.postoffice import Postoffice
from ps.van.inproc_van import InprocVan


def _row(node_id, role, addr):
    return Node(node_id, role, 0, "127.0.0.1", 1, addr).to_row()


def test_a_node_up_handled_before_the_table_is_adopted_keeps_the_new_address():
    config = Config.from_env({"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9",
                              "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1"})
    van = InprocVan()
    po = Postoffice(config, van)
    van.start(po._on_message, "127.0.0.1")
    try:
        sid = server_id(0)
        table = {"you": worker_id(0), "restart": 1, "down": {str(sid): "it died"},
                 "nodes": [_row(sid, Role.SERVER, "inproc://dead-server"), _row(worker_id(0), Role.WORKER, "inproc://me")]}
        # on the I/O thread, in the order they came: the table, then the server's restart is back
        po._on_message(Message(Command.NODE_TABLE, 1, 0, table))
        po._on_message(Message(Command.NODE_UP, 1, 0, {"row": _row(sid, Role.SERVER, "inproc://its-restart")}))
        po._adopt(table)                        # the main thread, later
        done = threading.Event()
        po.call_soon(done.set)
        assert done.wait(5), "the van's I/O thread did not run what was queued"
        assert po.nodes[sid].addr == "inproc://its-restart"
        assert van._peers[sid] == "inproc://its-restart"
        assert sid not in po.down
    finally:
        van.stop()
