"""ps.mxnet.engine: ps requests as operations of MXNet's dependency engine (in-process, real engine)."""
import threading

import pytest

mx = pytest.importorskip("mxnet")
pytestmark = pytest.mark.mxnet


def _run(engine, start, times):
    src, dst = mx.nd.zeros((4,)), mx.nd.zeros((4,))
    for _ in range(times):
        engine.push(start, [src], [dst])
        dst.wait_to_read()


def test_operations_run_on_an_engine_thread_that_keeps_its_python_state():
    """Thread-local values survive from one callback to the next: the engine thread's Python
    thread state is kept, not created and torn down (unmapping its frame stack) per call."""
    from ps.mxnet.engine import Engine
    local, seen = threading.local(), []

    def start(done):
        seen.append((threading.get_ident(), getattr(local, "calls", 0)))
        local.calls = getattr(local, "calls", 0) + 1
        done()
    _run(Engine(), start, 3)
    assert len(seen) == 3
    assert threading.get_ident() not in {ident for ident, _ in seen}
    per_thread = {}
    for ident, before in seen:          # each engine thread counts its own earlier calls
        assert before == per_thread.get(ident, 0), seen
        per_thread[ident] = before + 1


def test_an_operation_left_open_holds_its_written_array_until_done():
    from ps.mxnet.engine import Engine
    pending = []
    dst = mx.nd.zeros((4,))
    Engine().push(pending.append, [], [dst])
    waiter = threading.Thread(target=dst.wait_to_read, daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "the written array must stay locked while the operation is open"
    assert len(pending) == 1
    pending[0]()
    waiter.join(10)
    assert not waiter.is_alive()
    pending[0]()                        # a second completion is ignored, not a crash
    dst.wait_to_read()


def test_the_exit_drain_gives_up_at_its_bound_while_an_operation_stays_open():
    """At exit ps waits for MXNet's engine (mx.nd.waitall, which has no timeout) on a thread
    of its own: an operation that never completes costs the bound, not the process."""
    from ps.mxnet.engine import Engine
    from ps.mxnet.engine_ops import engine_drained
    opened = []
    Engine().push(opened.append, [], [mx.nd.zeros((4,))])
    assert not engine_drained(0.5)
    assert opened, "the engine never started the operation"
    opened[0]()                      # complete it: the engine drains
    assert engine_drained(30)



# run in a process of its own: with the bug, the engine thread calls freed memory (a crash or
# a hang inside MXNet, which no timeout in this process could end)
_DROPPED_ENGINE = """
import gc, threading, weakref
import mxnet as mx
from ps.mxnet.engine import Engine
dst, blocker, ran = mx.nd.zeros((4,)), [], []
Engine().push(blocker.append, [], [dst])              # holds dst: the next operation queues
engine = Engine()
engine.push(lambda done: (ran.append(1), done()), [], [dst])
alive = weakref.ref(engine)
del engine
gc.collect()
print("alive while queued:", alive() is not None, flush=True)
for _ in range(200):                                   # the first operation starts on an engine thread
    if blocker:
        break
    threading.Event().wait(0.05)
blocker[0]()
dst.wait_to_read()
gc.collect()
print("ran:", ran, "alive after:", alive() is not None, flush=True)
"""


@pytest.mark.process
def test_an_engine_nobody_holds_lives_while_its_operation_is_queued():
    """MXNet holds only a raw pointer to an Engine's callback: an Engine dropped with an
    operation still waiting in MXNet's queue must live until the operation is done, and no
    longer."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _DROPPED_ENGINE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "alive while queued: True" in out.stdout, out.stdout
    assert "ran: [1] alive after: False" in out.stdout, out.stdout
