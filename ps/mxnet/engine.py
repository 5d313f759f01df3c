"""Run a ps request as an operation of MXNet's dependency engine.

MXNet's own dist kvstore pushes each pushpull into its engine: the request starts when the
gradient is written, and the next forward pass waits only for the weights it reads. A
Python kvstore gets the same overlap through ``MXEnginePushAsyncND``: the engine calls us
(on one of its CPU threads) once the arrays are ready, and the operation stays open, the
written arrays locked, until ps calls the engine's completion callback when the last reply
has arrived.

The callback struct is ``mxnet::engine::CallbackOnComplete`` of MXNet 1.x (``include/mxnet/
engine.h``): three pointers, called as ``callback(engine, param, error)``.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

_ASYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# mxnet::FnProperty::kNormal: the operation starts on the CPU worker thread that has just
# written the gradient, as MXNet's own kvstore's do: no thread to wake, and ``start`` only
# queues the request for ps's I/O thread. (kCPUPrioritized, MXNet's separate pool, measured
# 7 % slower per conv step: a wake-up per key on a 2-core machine.)
_NORMAL = 0


class _OnComplete(ctypes.Structure):
    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p), ("param", ctypes.c_void_p)]


class _Context(ctypes.Structure):
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


Start = Callable[[Callable[[], None]], None]
_thread_state_kept = threading.local()
# MXNet keeps a raw pointer to an Engine's callback, not a reference to it: an Engine whose
# last user let go (a store closed, a temporary) with an operation still queued would be
# collected, and the engine thread would call freed memory. Each open operation holds its
# Engine here until it completes or is dropped.
_open_ops: dict[int, "Engine"] = {}
_open_lock = threading.Lock()
_job_ids = itertools.count(1)


def _keep_thread_state() -> None:
    """Keep this engine thread's Python thread state between our callbacks.

    A ctypes callback on a thread Python did not start creates a thread state and deletes
    it on return; in CPython 3.11 that maps and unmaps the state's frame stack every time,
    and each unmap interrupts the other cores (TLB shootdown), where MXNet computes. One
    extra PyGILState_Ensure, never released, lets the state outlive the callback. MXNet's
    engine threads are few; they are replaced only around a fork, and each replaced one
    leaves its state behind (about 16 KB).
    """
    if not getattr(_thread_state_kept, "done", False):
        ctypes.pythonapi.PyGILState_Ensure()
        _thread_state_kept.done = True


class Engine:
    """``push(start, reads, writes)``: the engine calls ``start(done)`` once ``reads`` are
    written and nobody else reads or writes ``writes``; ``done()`` (exactly once, from any
    thread) releases them."""

    def __init__(self) -> None:
        from mxnet.base import _LIB
        self._lib = _LIB
        self._jobs: dict[int, tuple[Start, tuple, Callable[[], None] | None]] = {}
        self._started: set[int] = set()
        self._lock = threading.Lock()
        self._run_cb = _ASYNC_FN(self._run)          # kept alive: the engine holds the pointer
        self._ctx = _Context(1, 0)                   # cpu(0)
        self._prop = ctypes.c_int(_NORMAL)

    @staticmethod
    def available(engine_type: str | None) -> bool:
        """The naive engine runs operations inline and must see them finish at once."""
        if (engine_type or "").startswith("Naive"):
            return False
        from mxnet.base import _LIB
        return hasattr(_LIB, "MXEnginePushAsyncND")

    def push(self, start: Start, reads: list[Any], writes: list[Any], priority: int = 0,
             name: bytes = b"ps_pushpull", skipped: Callable[[], None] | None = None) -> None:
        """``skipped()`` is called by :meth:`drop_skipped` if the engine never runs ``start``."""
        from mxnet.base import check_call
        job = next(_job_ids)
        with self._lock:
            self._jobs[job] = (start, (reads, writes), skipped)   # the NDArrays live until done
        with _open_lock:
            _open_ops[job] = self
        const = (ctypes.c_void_p * max(len(reads), 1))(*[a.handle.value for a in reads])
        mutable = (ctypes.c_void_p * max(len(writes), 1))(*[a.handle.value for a in writes])
        try:
            check_call(self._lib.MXEnginePushAsyncND(
                self._run_cb, ctypes.c_void_p(job), None, ctypes.byref(self._ctx),
                const, len(reads), mutable, len(writes), ctypes.byref(self._prop),
                ctypes.c_int(priority), ctypes.c_char_p(name), ctypes.c_bool(False)))
        except BaseException:
            self._forget([job])
            raise

    def _forget(self, jobs: list[int]) -> None:
        with self._lock:
            for job in jobs:
                self._jobs.pop(job, None)
                self._started.discard(job)
        with _open_lock:
            for job in jobs:
                _open_ops.pop(job, None)

    def _run(self, _rctx: int, on_complete: int, param: int) -> None:
        """On an engine thread. ``on_complete`` points into the caller's frame: copy it."""
        _keep_thread_state()
        oc = _OnComplete.from_address(on_complete)
        callback, engine, cb_param = oc.callback, oc.engine, oc.param
        with self._lock:
            start = self._jobs[param][0]
            self._started.add(param)
        fired = threading.Lock()

        def done() -> None:
            if not fired.acquire(blocking=False):
                return                                  # never complete an operation twice
            self._forget([param])
            _COMPLETE_FN(callback)(engine, cb_param, None)

        try:
            start(done)
        except BaseException:       # start must record its own errors; never leave the op open
            logger.exception("ps engine operation failed to start")
            done()

    def drop_skipped(self) -> int:
        """Once the engine has drained (``mx.nd.waitall()``), the operations it never ran:
        MXNet completes an operation without calling it when an input carries the exception
        of an earlier operation that failed (a forward pass that raised). Their ``skipped``
        callbacks run here; returns how many there were."""
        with self._lock:
            never_ran = [job for job in self._jobs if job not in self._started]
            dropped = [self._jobs[job] for job in never_ran]
        self._forget(never_ran)
        for _start, _arrays, skipped in dropped:
            if skipped is not None:
                skipped()
        return len(dropped)
