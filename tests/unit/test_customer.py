"""Customer: a worker's outstanding requests, filled in as replies arrive (no sockets)."""
import threading

import numpy as np
import pytest

from ps._timing import Deadline
from ps.customer import Customer, Handle
from ps.errors import MismatchError, PeerLostError, PSTimeoutError, RemoteError
from ps.frames import dtype_code
from ps.message import Command, Entry, Message, Op

S0, S1 = 8, 10
F32 = dtype_code(np.float32)


def reply(sender, *entries, frames=()):
    return Message(Command.DATA, sender, 9, list(entries), list(frames), request=False)


def no_failure():
    return None


def test_pull_replies_from_two_servers_fill_the_output_in_place():
    c = Customer()
    out = np.zeros(10, np.float32)
    req = c.new_request(10, out, {S0: 0, S1: 6}, "pull of key 3")
    c.on_reply(reply(S1, Entry(req.ts, Op.PULL, 3, 0, 4, 4, F32), frames=[np.full(4, 2, np.float32)]))
    assert not req.event.is_set() and req.pending == {S0}
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 0, 3, 6, F32), frames=[np.full(3, 1, np.float32)]))
    assert not req.event.is_set()            # 3 of S0's 6 elements still missing
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 3, 3, 6, F32), frames=[np.full(3, 1, np.float32)]))
    req.wait(Deadline(1), no_failure)
    np.testing.assert_array_equal(out, [1] * 6 + [2] * 4)
    assert c.pending() == []


def test_push_acks_count_servers_and_a_late_reply_is_ignored():
    c = Customer()
    req = c.new_request(2, None, {S0: 0, S1: 0}, "push to key 3")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    assert not req.event.is_set()
    c.on_reply(reply(S1, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    assert req.event.is_set() and req.error is None
    c.on_reply(reply(S1, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))   # a duplicate: no error, no count
    assert req.remaining == 0


def test_a_push_ack_repeated_before_the_other_server_answers_counts_once():
    c = Customer(keep=True)
    req = c.new_request(2, None, {S0: 0, S1: 0}, "push to key 3")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))   # S0 got the push twice
    assert not req.event.is_set() and req.pending == {S1}


def test_a_restarted_servers_repeated_chunk_does_not_complete_a_pull_early():
    """A restarted server can get a pull twice (the resend and a copy queued while it came
    back); the second answer's first chunk must not stand in for the first one's last."""
    c = Customer(keep=True)
    out = np.zeros(6, np.float32)
    req = c.new_request(6, out, {S0: 0}, "pull of key 3")
    req.sent.append((S0, Entry(req.ts, Op.PULL, 3, 0, 6, 6, F32), None))
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 0, 3, 6, F32), frames=[np.full(3, 1, np.float32)]))
    assert req.restart(S0) and req.remaining == 6          # died after one chunk: all of it again
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 0, 3, 6, F32), frames=[np.full(3, 5, np.float32)]))
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 0, 3, 6, F32), frames=[np.full(3, 7, np.float32)]))
    assert not req.event.is_set() and req.remaining == 3
    c.on_reply(reply(S0, Entry(req.ts, Op.PULL, 3, 3, 3, 6, F32), frames=[np.full(3, 5, np.float32)]))
    req.wait(Deadline(1), no_failure)
    np.testing.assert_array_equal(out, [5] * 6)


@pytest.mark.parametrize("kind,exc_type", [("KeyError", RemoteError), ("PeerLostError", PeerLostError)])
def test_an_error_reply_ends_the_request_with_the_servers_error(kind, exc_type):
    c = Customer()
    req = c.new_request(1, None, {S0: 0}, "push to key 3")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32).failed(kind, "S[8]: key 3 is not initialized")))
    with pytest.raises(exc_type, match="key 3 is not initialized"):
        req.wait(Deadline(1), no_failure)
    if exc_type is RemoteError:
        assert req.error.kind == kind and req.error.node == "S[8]"


def test_wait_times_out_naming_the_servers_that_did_not_answer():
    c = Customer()
    req = c.new_request(2, None, {S0: 0, S1: 0}, "push to key 7")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 7, 0, 0, 6, F32)))
    with pytest.raises(PSTimeoutError, match=r"push to key 7: no complete reply from S\[10\] within 0.2s"):
        req.wait(Deadline(0.2), no_failure)


def test_fail_all_wakes_waiters_runs_callbacks_and_refuses_new_requests():
    c = Customer()
    req = c.new_request(1, None, {S0: 0}, "push to key 3")
    seen = []
    c.when_done(req, lambda r: seen.append(r.error))
    waiter_error = []
    t = threading.Thread(target=lambda: waiter_error.append(pytest.raises(PeerLostError, req.wait,
                                                                          Deadline(5), no_failure)))
    t.start()
    c.fail_all(PeerLostError("S[8] died", "S[8]"))
    t.join(5)
    assert not t.is_alive() and waiter_error
    assert len(seen) == 1 and isinstance(seen[0], PeerLostError)
    with pytest.raises(PeerLostError, match="S\\[8\\] died"):
        c.new_request(1, None, {S0: 0}, "push to key 4")


def test_when_done_on_a_finished_request_runs_at_once():
    c = Customer()
    req = c.new_request(1, None, {S0: 0}, "push")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    seen = []
    c.when_done(req, seen.append)
    assert seen == [req]


def test_handle_callback_runs_once_after_every_request():
    c = Customer()
    reqs = [c.new_request(1, None, {S0: 0}, f"push {i}") for i in range(3)]
    handle = Handle(reqs, lambda: "result", 1.0, no_failure, c)
    calls = []
    handle.add_done_callback(lambda h: calls.append(h.wait()))
    for r in reqs[:2]:
        c.on_reply(reply(S0, Entry(r.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    assert calls == [] and not handle.done
    c.on_reply(reply(S0, Entry(reqs[2].ts, Op.PUSH, 3, 0, 0, 6, F32)))
    assert calls == ["result"] and handle.done


def test_a_servers_chunks_in_any_order_fill_the_output_and_finish_the_request():
    """A server answers a pushpull chunk by chunk as each is summed; the request finishes
    once every element came, whichever chunk came last."""
    c = Customer()
    out = np.zeros(6, np.float32)
    req = c.new_request(6, out, {S0: 0}, "pushpull of key 3")
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH | Op.PULL, 3, 3, 3, 6, F32), frames=[np.full(3, 2, np.float32)]))
    assert not req.event.is_set() and req.pending == {S0}       # the last offset came first: not done
    c.on_reply(reply(S0, Entry(req.ts, Op.PUSH | Op.PULL, 3, 0, 3, 6, F32), frames=[np.full(3, 1, np.float32)]))
    req.wait(Deadline(1), no_failure)
    np.testing.assert_array_equal(out, [1, 1, 1, 2, 2, 2])
    assert req.pending == set()


def test_an_abandoned_call_ends_with_the_error_and_ignores_a_late_reply():
    """A call whose check failed is dropped here: its waiter and callbacks get the error, the
    store's close has nothing left to wait for, and a reply that still comes changes nothing."""
    c = Customer()
    done = c.new_request(1, None, {S0: 0}, "push 0")
    out = np.zeros(2, np.float32)
    open_ = c.new_request(2, out, {S1: 0}, "pushpull 1")
    c.on_reply(reply(S0, Entry(done.ts, Op.PUSH, 3, 0, 0, 6, F32)))
    handle = Handle([done, open_], lambda: "result", 5.0, no_failure, c)
    seen = []
    handle.add_done_callback(lambda h: seen.append(h))
    handle.abandon(MismatchError("tensor 'w' differs"))
    assert c.pending() == [] and done.error is None          # the finished request keeps its result
    with pytest.raises(MismatchError, match="tensor 'w' differs"):
        handle.wait(0.1)
    assert seen == [handle]
    c.on_reply(reply(S1, Entry(open_.ts, Op.PUSH | Op.PULL, 4, 0, 2, 2, F32), frames=[np.full(2, 7, np.float32)]))
    assert out.tolist() == [0, 0] and c.pending() == []
