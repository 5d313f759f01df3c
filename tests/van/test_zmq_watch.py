"""ZmqVan.watch: the scheduler's fast failure detection. Real sockets on 127.0.0.1."""
import time

import pytest
import zmq

from ps.netutil import free_port
from ps.van import create_van
from tests.helpers import wait_for

pytestmark = pytest.mark.process


@pytest.mark.timeout(60)
def test_a_restarted_nodes_watch_replaces_the_watch_of_its_dead_address():
    """After a node's restart registers from a new port, whatever later binds the dead node's
    old port must not be reported as that node connecting and dropping (a false failure)."""
    events = []
    van, ctx = create_van("zmq"), zmq.Context()
    live, squatter = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    try:
        van.start(lambda msg: None, "127.0.0.1", name="scheduler")
        old, new = free_port(), live.bind_to_random_port("tcp://127.0.0.1", 20000, 32000)
        van.watch(5, f"tcp://127.0.0.1:{old}", lambda node, up: events.append((node, up)))
        van.watch(5, f"tcp://127.0.0.1:{new}", lambda node, up: events.append((node, up)))
        wait_for(lambda: (5, True) in events, 10, what="the watch of the live address to connect")
        events.clear()
        squatter.bind(f"tcp://127.0.0.1:{old}")   # another process takes the dead node's port
        time.sleep(1.0)                             # the old probe reconnected every 200 ms
        squatter.close(linger=0)
        time.sleep(1.0)
        assert events == []
    finally:
        van.stop()
        live.close(linger=0)
        squatter.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_a_watch_of_a_closed_port_reports_the_node_down_once():
    """A node that died before the watch ever connected leaves its port closed: the refused
    connection is reported as down (once, not at every 200 ms retry), so the scheduler need
    not wait for a heartbeat timeout to know."""
    events = []
    van = create_van("zmq")
    try:
        van.start(lambda msg: None, "127.0.0.1", name="scheduler")
        van.watch(7, f"tcp://127.0.0.1:{free_port()}", lambda node, up: events.append((node, up)))
        wait_for(lambda: events, 10, what="the watch of a closed port to report")
        time.sleep(1.0)                 # five more refused retries
        assert events == [(7, False)]
    finally:
        van.stop()
