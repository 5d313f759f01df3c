"""Whether the process at a peer's address is still there: ZmqVan's connection watches.

A watch is a silent DEALER connected to the address, whose connection state a ZeroMQ
monitor reports: TCP notices a dead process in milliseconds, long before a heartbeat
timeout would. The scheduler watches every node this way (and a node its scheduler).
Only the van's I/O thread touches these sockets, as every other of the van.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import zmq

REFUSED_WITHIN = 5.0    # s: a watch's connect failing this soon was refused (port closed), not timed out

OnEvent = Callable[[int, bool], None]


@dataclass
class _Watch:
    """A watched node's probe; ``up`` is the state last reported (None: nothing yet)."""
    node_id: int
    probe: zmq.Socket
    on_event: OnEvent
    up: bool | None = None
    started: float = field(default_factory=time.monotonic)


class Watches:
    """The watches of one van, on its I/O thread."""

    def __init__(self, poller: zmq.Poller, dealer: Callable[[], zmq.Socket]):
        """``dealer()`` makes a DEALER tuned as the van's own (CURVE keys, no high-water mark)."""
        self._poller = poller
        self._dealer = dealer
        self.monitors: dict[zmq.Socket, _Watch] = {}    # the loop hands their events to on_monitor

    def watch(self, node_id: int, address: str, on_event: OnEvent) -> None:
        """One per node: a restart's watch ends the watch of the dead address, which would
        otherwise keep reconnecting and report whatever process takes that port next as
        this node coming and going."""
        self.unwatch(node_id)
        probe = self._dealer()
        probe.setsockopt(zmq.RECONNECT_IVL, 200)
        monitor = probe.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        probe.connect(address)
        self.monitors[monitor] = _Watch(node_id, probe, on_event)
        self._poller.register(monitor, zmq.POLLIN)

    def unwatch(self, node_id: int) -> None:
        for monitor, watch in list(self.monitors.items()):
            if watch.node_id == node_id:
                self._unwatch(monitor)

    def _unwatch(self, monitor: zmq.Socket) -> None:
        probe = self.monitors.pop(monitor).probe
        self._poller.unregister(monitor)
        probe.disable_monitor()
        monitor.close(linger=0)
        probe.close(linger=0)

    def on_monitor(self, monitor: zmq.Socket) -> None:
        watch = self.monitors[monitor]
        while not monitor.closed and monitor.poll(0):      # on_event may have unwatched it
            event = _event(monitor.recv_multipart())
            # a connection refused at once (a node that died before the probe ever connected:
            # its port is closed) is as down as a closed one; reported once, not every retry.
            # Not a retry after a long silence: a connect that timed out (a firewall dropping
            # the scheduler's packets) says nothing of the node, which heartbeats cover
            if event == zmq.EVENT_CONNECT_RETRIED and (watch.up is not None or
                                                       time.monotonic() - watch.started > REFUSED_WITHIN):
                continue
            up = event == zmq.EVENT_CONNECTED
            if up != watch.up:
                watch.up = up
                watch.on_event(watch.node_id, up)

    def close(self) -> None:
        for monitor in list(self.monitors):
            self._unwatch(monitor)


def _event(frames: list[bytes]) -> int:
    """The event of one monitor message: libzmq sends a frame of a 16-bit event and a 32-bit
    value in the machine's byte order, then the endpoint. Read here rather than with
    ``zmq.utils.monitor``, whose import brings in asyncio: some 30 ms of every process's start."""
    return struct.unpack("=H", frames[0][:2])[0]
