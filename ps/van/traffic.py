"""What a van moved: the counters behind ``transport_stats()`` (ps messages' meta and data
frames, without ZeroMQ's routing frames)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Traffic:
    """The I/O thread's counters, and apart from them the two a caller's thread keeps
    (``read_here``), so that neither thread's ``+=`` races the other's."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    sent_now: int = 0            # of messages_sent, written by a caller's thread (send_now)
    stale: int = 0               # dropped: queued for a peer's incarnation that died
    read_here: int = 0           # messages a caller's thread read (read_here)
    read_here_bytes: int = 0

    def sent(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.messages_sent += 1

    def received(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        self.messages_received += 1

    def stats(self, streams: int) -> dict[str, int]:
        """``transport_stats()``: what was read on a caller's thread counts as received too;
        the optional counters only when there is something to say."""
        stats = {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received + self.read_here_bytes,
                 "messages_sent": self.messages_sent, "messages_received": self.messages_received + self.read_here}
        extra = {"stale": self.stale, "streams": streams, "sent_now": self.sent_now, "read_here": self.read_here}
        stats.update((k, v) for k, v in extra.items() if v)
        return stats
