"""The connections a worker or server opens to the nodes of its table: one for data per node,
and one of its own for credits (PS_SEND_WINDOW), opened on first use. Which address a data
connection takes (a server's ipc:// twin on this machine, else its address), and what a
node's death and restart do to both, is decided here; the van does the connecting.
"""
from __future__ import annotations

import os
import socket

from .message import Node
from .van import Van


def machine_id() -> str:
    """Same host *and* same network namespace: only then may a peer's ipc:// twin replace
    its tcp:// address (namespaced test hosts share a filesystem but not a network)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}/{netns}"


def data_address(node: Node) -> str:
    """The server's ipc:// twin when it runs on this machine (same boot, path visible), else its address."""
    local = node.local
    if local and local[1] and node.addr.startswith("tcp://") and local[1] == machine_id() \
            and os.path.exists(local[0][len("ipc://"):]):
        return local[0]
    return node.addr


class PeerLinks:
    """Keyed by node id. ``nodes`` is the Postoffice's node table (read, never changed here)."""

    def __init__(self, van: Van, nodes: dict[int, Node], local_ipc: bool):
        self.van, self.nodes, self.local_ipc = van, nodes, local_ipc
        self._data: dict[int, str] = {}      # node id -> address of the data connection to it
        self._credit: dict[int, bool] = {}   # node id -> whether credits to it have a connection of their own

    def connect(self, node_id: int) -> None:
        """Open the data connection to a node of the table, or reopen it to a restarted
        node's new address (never twice to one address: the peer's ROUTER would refuse a
        second connection with our identity while it still holds the first)."""
        node = self.nodes[node_id]
        address = data_address(node) if self.local_ipc else node.addr
        if self._data.get(node_id) != address:
            self._data[node_id] = address
            self._credit.pop(node_id, None)    # the van closes it: reopened on the next credit
            self.van.connect(node_id, address)

    def link_kind(self, node_id: int) -> str:
        """How this node reaches ``node_id``: "inproc" (its own process), "ipc" (this machine), "tcp"."""
        return self.van.endpoint_used(self._data.get(node_id, "")).partition("://")[0]

    def over_network(self, node_id: int) -> bool:
        """Whether the data connection to ``node_id`` crosses a network (not this machine's ipc://)."""
        return not self._data.get(node_id, "").startswith("ipc://")

    def open_credit(self, node_id: int) -> None:
        """The credit connection to ``node_id`` (Van.connect_control), opened on first use
        and again after the node restarted."""
        if node_id in self._credit or node_id not in self.nodes:
            return
        self._credit[node_id] = self.van.connect_control(node_id, self.nodes[node_id].addr)

    def down(self, node_id: int) -> None:
        """``node_id`` died: both its connections close; the data one is reopened (to
        whatever address) when it is back."""
        if self._credit.pop(node_id, None) or node_id in self._data:
            self.van.disconnect(node_id)
        if node_id in self._data:
            self._data[node_id] = ""

    def up(self, node_id: int) -> None:
        """``node_id``'s restart is in the table: a fresh data connection even to the old
        address (the old one may still hold what was queued for the dead process); its
        credit connection is reopened on the next credit. On the I/O thread: before any resend."""
        credits = self._credit.pop(node_id, None)
        if node_id in self._data:
            self._data[node_id] = ""
            self.connect(node_id)          # closes the credit connection too
        elif credits:
            self.van.disconnect(node_id)
