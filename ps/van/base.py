"""The transport interface: move Messages between nodes, know nothing of membership."""
from __future__ import annotations

import abc
import logging
from typing import Any, Callable, Protocol

from ..errors import NativeNodeError
from ..message import Message

# s: the soonest a tick's next pass of the I/O loop comes (Van.add_tick; the loop's timer is in ms)
TICK_SOONEST = 0.001

logger = logging.getLogger(__name__)

OnMessage = Callable[[Message], None]
PeerLost = Callable[[Any, Message, float], None]   # (peer, the unacknowledged message, seconds waited)


def control_identity(identity: bytes) -> bytes:
    """The identity of the connection a node sends only credits on (``connect_control``):
    a ROUTER tells it from the node's data connection by it."""
    return identity + b"-credit"


class Van(Protocol):
    """A node's transport: one receiving endpoint plus a connection per peer.

    ``on_message`` runs on the van's single I/O thread; handlers there must not block.
    ``send`` may be called from any thread; messages to one peer keep their order.
    A message with ``route`` set goes back over the connection it came from (the
    sender need not be listening itself); otherwise it goes to ``recver``'s address,
    which must have been ``connect``-ed.
    """

    address: str = ""
    local_address: str | None = None   # an ipc:// twin of ``address`` for peers on this machine
    on_peer_lost: PeerLost | None = None   # set by the owner; called by vans that resend (PS_RESEND)
    on_native_node: Callable[[NativeNodeError], None] | None = None   # a native MXNet node spoke to us

    @abc.abstractmethod
    def start(self, on_message: OnMessage, host: str, port: int = 0,
              port_range: tuple[int, int] | None = None, name: str = "") -> str:
        """Bind the receiving endpoint and start the I/O thread; return the bound address."""

    def endpoint(self, host: str, port: int) -> str:
        """The address a peer listening on host:port has for this kind of van."""
        return f"tcp://{host}:{port}"

    @abc.abstractmethod
    def connect(self, node_id: int, address: str) -> None:
        """Open (asynchronously) a connection to ``node_id`` listening at ``address``."""

    def watch(self, node_id: int, address: str, on_event: Callable[[int, bool], None]) -> None:
        """Report ``on_event(node_id, connected)`` when the connection to a node drops or
        comes back (fast failure detection); vans that cannot tell do nothing. A second
        watch of the same ``node_id`` replaces the first."""

    def unwatch(self, node_id: int) -> None:
        """Stop watching ``node_id``; no more events for it."""

    @abc.abstractmethod
    def send(self, msg: Message) -> None:
        """Queue ``msg``; never blocks on the network."""

    def send_now(self, msg: Message) -> bool:
        """Write ``msg`` on the calling thread if this van can without its I/O thread (and
        nothing queued before it is passed); False: nothing was done, ``send`` it."""
        return False

    def read_here(self, node_id: int, until: Callable[[], bool], seconds: float,
                  mine: Callable[[Message], bool]) -> bool:
        """On a thread waiting for a reply from ``node_id``: read that peer's messages here
        for up to ``seconds`` or until ``until()``, handling those ``mine(msg)`` accepts on
        this thread; the first it refuses, and all after it, go to the I/O thread as usual.
        False: wait as usual, for nothing more is read here (this van cannot, or it handed
        messages to the I/O thread)."""
        return False

    @abc.abstractmethod
    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (after the messages already queued)."""

    @abc.abstractmethod
    def call_later(self, fn: Callable[[], None]) -> None:
        """Like ``call_soon``, but on the I/O thread too it runs after what is already
        queued, not inline: work queued in one burst can be batched by the last of it."""

    @abc.abstractmethod
    def stop(self, linger: float = 0.0, timeout: float = 5.0) -> None:
        """Stop the I/O thread and close sockets; ``linger`` seconds to flush queued sends."""

    @property
    @abc.abstractmethod
    def in_io_thread(self) -> bool:
        """True when called from the van's own I/O thread."""

    def transport_stats(self) -> dict[str, int]:
        """Counters of the transport: bytes sent and received, resends, duplicates..."""
        return {}

    def forget(self, peer: Any) -> None:
        """Drop what the transport keeps about a peer (a node id or a ROUTER identity) that
        died: a restarted node starts its channels afresh (PS_RESEND's sequence numbers)."""

    def disconnect(self, node_id: int) -> None:
        """Close the connection to a node that died: left open, it would reconnect by
        itself to a restart at the same address and hand it what was queued for the dead one."""

    def unsent(self, node_id: int, route: bytes | None = None) -> int | None:
        """Bytes the kernel holds, not yet sent, on the connection to ``node_id`` (or the one
        ``route`` came in on); None if this van cannot tell (PS_SEND_LOWAT is then off)."""
        return None

    def add_tick(self, fn: Callable[[], float | None]) -> None:
        """Run ``fn`` on the I/O thread after every pass of its loop. While it holds messages
        back until a socket drains (PS_SEND_LOWAT) it returns the seconds until it wants to
        run again, and the next pass comes by then (at the soonest a millisecond later);
        None: it waits for nothing. Vans that cannot tell ``unsent`` never call it."""

    def endpoint_used(self, address: str) -> str:
        """The endpoint a connection to ``address`` really goes to (a peer in this process:
        its inproc:// twin)."""
        return address

    def connect_control(self, node_id: int, address: str) -> bool:
        """Open a second connection to ``node_id`` for credits (Command.CREDIT), which must
        not wait behind bulk data; False if this van has none (they travel with the data)."""
        return False
