"""The copy-on-write rule for zero-copy replies, in one place.

A server replies to a pull with views of its stored values, and ZeroMQ sends those
frames without copying, some time later, from its own thread. So a value must not be
changed in place while (a) a reply made from it has not yet been handed to the transport,
or (b) the transport may still be reading it. The store *lends* a value when it puts a
view of it in a reply and asks :meth:`BufferGuard.writable` before changing one; the
server tells the guard when replies are handed over and which arrays each message reads.
A value that is still in use is replaced by a private copy, never waited for.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

PRUNE_AT = 16           # tracked arrays before finished ones are dropped
SETTLE_WAIT = 0.005     # seconds busy() waits for lagging trackers before saying "busy"
ZERO_COPY_MIN = 65536   # pyzmq copies smaller frames anyway: no need to track them


class _Sent:
    """Stands for the tracker of a message that was dropped, or copied on sending."""

    done = True

    def wait(self, timeout: float) -> None:
        return None


SENT = _Sent()


class _Unsent:
    """A reply handed to the van but not yet to ZeroMQ (it may wait in the van's queue
    behind other messages): its arrays are busy until ZeroMQ has let go of them."""

    __slots__ = ("tracker",)

    def __init__(self) -> None:
        self.tracker: Any = None

    @property
    def done(self) -> bool:
        return self.tracker is not None and self.tracker.done

    def wait(self, timeout: float) -> None:
        if self.tracker is None:
            raise TimeoutError("not sent yet")
        self.tracker.wait(timeout)


def _owner(array: np.ndarray) -> np.ndarray:
    """The last ndarray in ``array``'s chain of bases: the same for a value and its slices."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class BufferGuard:
    def __init__(self) -> None:
        self._lent: dict[int, np.ndarray] = {}       # id -> value in replies not yet sent
        self._inflight: dict[int, list] = {}         # id(base) -> [base, tracker, ...]

    # -- the store's side ----------------------------------------------------------------
    def lend(self, array: np.ndarray) -> None:
        """A reply not yet handed to the transport holds a view of ``array``."""
        self._lent[id(array)] = array

    def writable(self, array: np.ndarray) -> np.ndarray:
        """``array`` itself if nothing may still read it, else a private copy to change."""
        if id(array) in self._lent or self.busy(array):
            self._lent.pop(id(array), None)
            return array.copy()
        return array

    def busy(self, array: np.ndarray, wait: float = SETTLE_WAIT) -> bool:
        """True while a zero-copy send may still read ``array``.

        pyzmq marks a tracker done from its garbage-collector *thread*, which needs the GIL
        the server's I/O thread holds, so trackers lag behind the real sends: wait for them
        briefly (releasing the GIL) before answering True and making the caller copy.
        """
        entry = self._inflight.get(id(array))
        if entry is None:
            return False
        live = [t for t in entry[1:] if not t.done]
        if live and wait > 0:
            end = time.monotonic() + wait
            for t in live:
                try:
                    t.wait(max(0.0, end - time.monotonic()))
                except Exception:  # noqa: BLE001 - zmq.NotDone: still in flight
                    break
            live = [t for t in live if not t.done]
        if live:
            entry[1:] = live
            return True
        del self._inflight[id(array)]
        return False

    # -- the server's side ---------------------------------------------------------------
    def on_sent(self, frames: list[np.ndarray]) -> Callable[[Any], None] | None:
        """The callback a message with ``frames`` gets: the arrays those frames view are
        busy from now until the transport's tracker (its argument, or None if the van
        dropped or copied the message) says ZeroMQ let go of them. None when every frame
        is copied anyway."""
        bases = [f.base if f.base is not None else f for f in frames if f.nbytes >= ZERO_COPY_MIN]
        if not bases:
            return None
        marker = _Unsent()
        self._track(bases, marker)

        def sent(tracker: Any) -> None:
            marker.tracker = SENT if tracker is None else tracker
        return sent

    def handed_over(self, pending: list[Any] = ()) -> None:
        """Every reply made so far is with the transport (whose trackers now guard it),
        but those whose ``pending`` frames still wait to be sent (PS_SEND_WINDOW). A
        pending frame is a slice of the value it reads, so it is matched to that value by
        the array that owns their memory: one set lookup per lent value (comparing every
        pair with ``np.may_share_memory`` cost milliseconds per reply batch on a server
        with many replies queued)."""
        if not pending or not self._lent:
            self._lent.clear()
            return
        owners = {id(_owner(f)) for f in pending}
        self._lent = {k: a for k, a in self._lent.items() if id(_owner(a)) in owners}

    def _track(self, bases: list[np.ndarray], tracker: Any) -> None:
        if len(self._inflight) > PRUNE_AT:    # entries pin their arrays: drop finished ones early
            for key in [k for k, v in self._inflight.items() if all(t.done for t in v[1:])]:
                del self._inflight[key]
        for base in bases:
            self._inflight.setdefault(id(base), [base]).append(tracker)
