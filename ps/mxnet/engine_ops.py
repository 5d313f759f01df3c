"""The pushpulls a ``PSKVStore`` hands to MXNet's engine, and what it must wait for.

MXNet's own dist kvstore runs each pushpull as an engine operation: it starts when backward
has written the gradient, and the next forward waits only for the weights it reads, so
traffic overlaps computation on both sides of a step. ps does the same through
:class:`~ps.mxnet.engine.Engine`. What that costs the store is bookkeeping, kept here: how
many such operations have not finished (every call outside the engine waits for them, so
requests reach the servers in program order), the errors they met (the engine cannot carry
them: they are raised at the store's next call, at ``mx.nd.waitall()`` and at exit), and the
staging arrays where MKL-DNN may change a weight's memory layout.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import mxnet as mx
import numpy as np

from .._timing import POLL, Deadline
from ..kvstore import KVStore
from .arrays import dense_cpu, numpy_view, single
from .engine import Engine

logger = logging.getLogger(__name__)

mx_waitall = mx.nd.waitall          # MXNet's own, before ps.mxnet.hooks.patch_waitall
_MKLDNN_BUILD = mx.runtime.Features().is_enabled("MKLDNN")


def engine_for(kv: KVStore) -> Engine | None:
    """PS_MXNET_ENGINE=0 keeps every call outside MXNet's engine (the step then waits for
    its last reply); so does MXNet's naive engine."""
    cfg = kv.config
    if not cfg.mxnet_engine or not Engine.available(cfg.mxnet_engine_type):
        return None
    return Engine()


def engine_drained(timeout: float) -> bool:
    """``mx.nd.waitall()`` within ``timeout``: whether every operation queued in MXNet's
    engine has run or been skipped. It waits on a thread of its own: MXNet's wait has no bound."""
    drained = threading.Event()

    def wait() -> None:
        try:
            mx_waitall()
        except mx.base.MXNetError:
            pass                         # an operation's error: the script has raised it already
        finally:
            drained.set()
    threading.Thread(target=wait, name="ps-exit-waitall", daemon=True).start()
    return drained.wait(timeout)


class EnginePushpulls:
    """One store's pushpulls in MXNet's engine (none at all where :func:`engine_for` says no)."""

    def __init__(self, kv: KVStore) -> None:
        self._kv, self._engine = kv, engine_for(kv)
        self._open = 0                       # handed to the engine, not finished
        self.ops = 0                         # how many were (tests, stats)
        self._idle = threading.Condition()
        self._errors: list[BaseException] = []
        self._staging: dict[Any, Any] = {}
        # MKL-DNN may change a weight's memory layout inside MXNet's engine (see start)
        self._relayout = _MKLDNN_BUILD and kv.config.mxnet_mkldnn

    def start(self, key: Any, value: Any, targets: Any, priority: int) -> bool:
        """Hand the pushpull of ps key ``key`` to MXNet's engine; False (nothing done) where
        this does not apply: the caller takes the plain path.

        Where MKL-DNN may change an array's memory layout inside the engine (an inference
        pass reorders (de)convolution weights, 3-D and up, asynchronously; among fp32 ops
        only those), replies go into a staging array ps owns and an engine copy (which knows
        layouts) moves them into the weight, as MXNet's own kvstore copies from its receive
        buffer. Elsewhere they go straight in."""
        if self._engine is None:
            return False
        src, dst = single(value), single(targets)
        if isinstance(key, (list, tuple)) or src is None or dst is None:
            return False
        info = self._kv.key_info(key)
        if info is None or not (dense_cpu(src) and dense_cpu(dst)):
            return False
        if any(tuple(a.shape) != info.shape or np.dtype(a.dtype) != info.dtype for a in (src, dst)):
            return False                     # the plain path raises the error naming them
        recv = self._staging_for(key, dst) if self._relayout and len(info.shape) >= 3 else dst
        grad, weight = numpy_view(src, write=False, wait=False), numpy_view(recv, write=True, wait=False)
        if grad is None or weight is None:
            return False
        kv = self._kv

        def run(done: Any) -> None:          # on MXNet's CPU worker thread, gradient written:
            def issue() -> None:             # only hand over; the I/O thread builds and sends,
                try:                         # so MXNet's compute waits no longer than that
                    kv.pushpull(key, grad, out=weight, priority=priority, block=False).add_done_callback(finished)
                except BaseException as exc:
                    fail(exc)

            def finished(handle: Any) -> None:
                try:
                    handle.wait()
                except BaseException as exc:
                    self._record(key, exc)
                finally:                     # MXNet's operation first: whoever settle()
                    done()                   # releases (e.g. a fork) finds it complete
                    self._finished()

            def fail(exc: BaseException) -> None:
                self._record(key, exc)
                done()
                self._finished()
            try:
                kv.call_soon(issue)
            except BaseException as exc:     # the van has stopped
                fail(exc)

        with self._idle:
            self._open += 1
            self.ops += 1
        try:
            self._engine.push(run, [] if src is recv else [src], [recv], priority, skipped=self._finished)
        except BaseException:
            self._finished()
            raise
        if recv is not dst:
            recv.copyto(dst)                 # an engine operation too: after the replies
        return True

    def _staging_for(self, key: Any, like: Any) -> Any:
        staging = self._staging.get(key)
        if staging is None:
            staging = self._staging[key] = mx.nd.empty(like.shape, ctx=mx.cpu(), dtype=like.dtype)
        return staging

    def _record(self, key: Any, exc: BaseException) -> None:
        """On the I/O thread: keep it for the store's next call, and say so now (the caller
        may not call again, e.g. after its last step)."""
        logger.error("pushpull of key %r in MXNet's engine failed: %s", key, exc)
        if hasattr(exc, "add_note"):
            exc.add_note(f"(raised by an earlier pushpull of key {key!r} that ran in MXNet's engine)")
        self._errors.append(exc)

    def _finished(self) -> None:
        with self._idle:
            self._open -= 1
            if not self._open:
                self._idle.notify_all()

    def settle(self, timeout: float | None = None, raise_errors: bool = True) -> None:
        """Before any call outside the engine: let the engine's pushpulls finish (they may
        still wait for a gradient), so requests reach the servers in program order. The
        bound (``PS_REQUEST_TIMEOUT`` unless given) does not count this process's own pauses."""
        if self._open:
            deadline = Deadline(timeout if timeout is not None else (self._kv.config.request_timeout or None))
            deadline.paused()
            with self._idle:
                while self._open:
                    self._idle.wait(deadline.remaining(POLL))
                    deadline.paused()
                    deadline.check(f"{self._open} pushpulls queued in MXNet's engine to finish")
        if raise_errors:
            self.raise_error()

    def raise_error(self) -> None:
        """The first error a pushpull in the engine met since the last call, if any."""
        if self._errors:
            errors, self._errors = self._errors, []
            raise errors[0]

    def at_exit(self, bound: float) -> None:
        """Before the store closes: the last steps' pushpulls may still sit in MXNet's engine;
        send them, or MXNet's shutdown would drop them. Those whose gradient an operation
        that failed never wrote (the script is exiting on that error) the engine skips: they
        are not sent, and nothing waits for them."""
        if self._open and self._engine is not None:
            if not engine_drained(bound):
                raise TimeoutError(f"timed out after {bound:g}s waiting for {self._open} pushpulls "
                                   "queued in MXNet's engine to finish")
            skipped = self._engine.drop_skipped()
            if skipped:
                logger.warning("at exit: %d pushpulls were not sent: MXNet's engine skipped them because an "
                               "operation they depend on failed (its error is the script's)", skipped)
        self.settle(timeout=bound)
