"""Whole clusters in one process, over the in-process van and over ZeroMQ on 127.0.0.1."""
import json

import numpy as np
import pytest

import ps
from ps.testing import local_cluster

pytestmark = pytest.mark.process


VANS = ["inproc", "zmq"]


@pytest.fixture(params=VANS)
def van(request):
    return request.param


def rounds_job(kv, rounds=4):
    """Spec §5.3: key 3 = ones(2,3); each round worker r pushes ones*(r+1), then pulls."""
    kv.init(3, np.ones((2, 3), np.float32))
    seen = []
    for _ in range(rounds):
        kv.push(3, np.ones((2, 3), np.float32) * (kv.rank + 1))
        out = kv.pull(3)
        assert np.all(out == out.flat[0])
        seen.append(round(float(out.flat[0]), 6))
    return seen


def test_sync_no_optimizer_assigns_round_sum(van):
    with local_cluster(2, 2, van=van) as c:
        assert c.run(rounds_job) == [[3.0] * 4] * 2


def test_sync_sgd_matches_mxnet(van):
    def job(kv):
        kv.set_optimizer(ps.optim.SGD(learning_rate=0.1))
        return rounds_job(kv)
    with local_cluster(2, 2, van=van) as c:
        assert c.run(job) == [[0.7, 0.4, 0.1, -0.2]] * 2


def test_sharded_key_is_split_and_reassembled_exactly(van):
    rng = np.random.default_rng(0)
    init = rng.standard_normal(3_000_001).astype(np.float32)
    grads = [rng.standard_normal(init.size).astype(np.float32) for _ in range(2)]

    def job(kv):
        kv.init(7, init)
        first = kv.pull(7)
        out = np.empty_like(init)
        kv.pushpull(7, grads[kv.rank], out=out)
        return first, out
    # bound 1000 -> the 3M-element key is cut over both servers and travels in 1 MiB chunks
    with local_cluster(2, 2, van=van, bigarray_bound=1000) as c:
        (f0, o0), (f1, o1) = c.run(job)
    np.testing.assert_array_equal(f0, init)
    np.testing.assert_array_equal(f1, init)
    np.testing.assert_array_equal(o0, grads[0] + grads[1])
    np.testing.assert_array_equal(o1, o0)


def test_async_sgd_applies_every_push(van):
    def job(kv):
        kv.init(3, np.ones(4, np.float32))
        kv.set_optimizer(ps.optim.SGD(learning_rate=0.1))
        for _ in range(3):
            for turn in range(kv.num_workers):    # take turns so the order is known
                if turn == kv.rank:
                    kv.push(3, np.full(4, kv.rank + 1, np.float32), block=True)
                kv.barrier()
        return kv.pull(3)
    with local_cluster(1, 2, van=van, type="dist_async") as c:
        for out in c.run(job):
            np.testing.assert_allclose(out, np.full(4, 1 - 3 * 0.3), rtol=1e-6)


def test_errors_name_the_key_by_its_label_and_the_server_command(van):
    """A caller that moves its users' keys (ps.mxnet's second kvstore of a process) gives
    labels: errors raised here and the servers' own then name the key the user knows."""
    def job(kv):
        kv.init("w#moved", np.ones(4, np.float32), labels="'w' (of store 2)")
        found = {}
        with pytest.raises(ValueError) as shape:
            kv.push("w#moved", np.ones(5, np.float32))
        with pytest.raises(ps.RemoteError) as server:      # dist_async without an optimizer
            kv.push("w#moved", np.ones(4, np.float32), block=True)
        with pytest.raises(ps.RemoteError) as command:
            kv.server_command("no_such_command")
        found = {"shape": str(shape.value), "server": str(server.value), "command": str(command.value)}
        kv.barrier()
        return found
    with local_cluster(1, 2, van=van, type="dist_async") as c:
        for found in c.run(job):
            assert found["shape"].startswith("push to key 'w' (of store 2): shape (5,)"), found
            assert found["server"].startswith("push to key 'w' (of store 2): "), found
            assert "set_optimizer" in found["server"] and "w#moved" not in found["server"], found
            assert found["command"].startswith("server command 'no_such_command': server "), found
            assert "unknown server command" in found["command"], found


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async"])
def test_server_profile_holds_each_servers_requests(van, tmp_path, monkeypatch, mode):
    """The "profiler" command (what mx.profiler's profile_process='server' sends): every
    server writes rank<N>_<name> when it stops, with a span per request entry it handled,
    whether it sums rounds or updates on each push."""
    monkeypatch.chdir(tmp_path)

    def job(kv):
        kv.init(5, np.ones(40, np.float32))
        if mode == "dist_async":
            kv.set_optimizer(ps.optim.SGD(learning_rate=0.1))
        if kv.rank == 0:
            with pytest.raises(ps.RemoteError, match="plain file name"):
                kv.server_command("profiler", {"action": "config", "params": {"filename": "../x.json"}})
            kv.server_command("profiler", {"action": "config", "params": {"filename": "srv.json"}})
            kv.server_command("profiler", {"action": "state", "run": True})
        kv.barrier()
        for _ in range(3):
            kv.pushpull(5, np.ones(40, np.float32))
        kv.barrier()
        if kv.rank == 0:
            kv.server_command("profiler", {"action": "state", "run": False})
        kv.barrier()
    with local_cluster(2, 2, van=van, bigarray_bound=10, type=mode) as c:
        c.run(job)
    for rank in (0, 1):
        doc = json.loads((tmp_path / f"rank{rank}_srv.json").read_text())
        requests = [e for e in doc["traceEvents"] if e.get("cat") == "request"]
        assert len(requests) == 2 * 3, requests            # 2 workers x 3 pushpulls of its slice
        assert {e["name"] for e in requests} == {"pushpull"}
        assert {e["args"]["worker"] for e in requests} == {0, 1}
        assert any(e["name"] == "send replies" for e in doc["traceEvents"])
        assert doc["otherData"]["rank"] == rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0_srv.json", "rank1_srv.json"]


def test_async_without_optimizer_is_a_clear_error_and_cluster_keeps_serving(van):
    def job(kv):
        kv.init(3, np.ones(4, np.float32))
        with pytest.raises(ps.RemoteError, match="set_optimizer"):
            kv.push(3, np.ones(4, np.float32), block=True)
        kv.barrier()       # both pushes were refused before anyone sets the optimizer
        kv.set_optimizer(ps.optim.SGD(learning_rate=1.0))
        kv.barrier()
        return kv.pull(3)
    with local_cluster(1, 2, van=van, type="dist_async") as c:
        assert all(np.all(out == 1.0) for out in c.run(job))


def test_str_keys_float16_and_lists(van):
    def job(kv):
        kv.init(["fc1_weight", "fc1_bias"], [np.zeros((3, 4), np.float16), np.zeros(4, np.float64)])
        grads = [np.full((3, 4), 0.5, np.float16), np.full((3, 4), 0.25, np.float16)]   # two "devices"
        outs = [np.empty((3, 4), np.float16), np.empty((3, 4), np.float16)]
        kv.pushpull("fc1_weight", grads, out=outs)
        bias = kv.pushpull("fc1_bias", np.full(4, kv.rank, np.float64))
        both = kv.pull(["fc1_weight", "fc1_bias"])          # a list of keys, no out: new arrays
        return outs, bias, both
    with local_cluster(2, 2, van=van) as c:
        for outs, bias, both in c.run(job):
            for o in outs:
                assert o.dtype == np.float16 and np.all(o == 1.5)
            np.testing.assert_array_equal(bias, np.full(4, 1.0))
            assert [b.dtype for b in both] == [np.float16, np.float64]
            np.testing.assert_array_equal(both[0], np.full((3, 4), 1.5))
            np.testing.assert_array_equal(both[1], bias)


def test_nonblocking_calls_pipeline(van):
    keys = list(range(50))

    def job(kv):
        kv.init(keys, [np.full(16, k, np.float32) for k in keys])
        handles = [kv.pushpull(k, np.full(16, kv.rank + 1, np.float32), block=False) for k in keys]
        assert all(isinstance(h, ps.Handle) for h in handles)
        kv.wait_all()
        return [h.wait() for h in handles]
    with local_cluster(2, 2, van=van) as c:
        for outs in c.run(job):
            assert all(np.all(o == 3.0) for o in outs)


def test_bad_inputs_raise_clearly_and_data_survives(van):
    def job(kv):
        kv.init(3, np.ones((2, 3), np.float32))
        with pytest.raises(ValueError, match=r"key 3: shape \(3, 2\)"):
            kv.push(3, np.ones((3, 2), np.float32))
        with pytest.raises(TypeError, match="dtype float64"):
            kv.push(3, np.ones((2, 3)))
        with pytest.raises(KeyError, match="key 42 is not initialized"):
            kv.pull(42)
        with pytest.raises(ValueError, match="already initialized"):
            kv.init(3, np.ones((2, 3), np.float32))
        with pytest.raises(TypeError, match="mix int and str"):
            kv.init("w", np.ones(2, np.float32))
        return kv.pull(3)
    with local_cluster(2, 2, van=van) as c:
        assert all(np.all(out == 1.0) for out in c.run(job))


def test_worker_with_fewer_steps_is_named_instead_of_hanging(van):
    """The error names the worker and the script's own key (servers know a str key only by
    its hash)."""
    def job(kv):
        kv.init("fc1_weight", np.ones(4, np.float32))
        steps = 2 if kv.rank == 1 else 3
        for step in range(steps):
            try:
                kv.pushpull("fc1_weight", np.ones(4, np.float32))
            except ps.PeerLostError as exc:
                return f"step {step}: {exc}"
        if kv.rank == 1:
            kv.close()
        return "done"
    with local_cluster(1, 2, van=van, timeout=20) as c:
        first, second = c.run(job)
    assert second == "done"
    assert first.startswith("step 2: pushpull of key 'fc1_weight': ") and "worker 1" in first
    assert "closed its store" in first


def test_barrier_and_properties(van):
    with local_cluster(3, 2, van=van) as c:
        props = c.run(lambda kv: (kv.rank, kv.num_workers, kv.num_servers, kv.type, kv.barrier()))
    assert props == [(0, 2, 3, "dist_sync", None), (1, 2, 3, "dist_sync", None)]


def test_request_timeout_names_the_servers(van):
    import time

    def job(kv):
        kv.init(3, np.ones(4, np.float32))
        if kv.rank == 0:
            with pytest.raises(ps.PSTimeoutError, match=r"pushpull of key 3: no complete reply from S\[8\]"):
                kv.pushpull(3, np.ones(4, np.float32))      # worker 1 has not pushed yet
        else:
            time.sleep(1.5)
            out = kv.pushpull(3, np.ones(4, np.float32))    # completes the round late
            assert np.all(out == 2.0)
        kv.barrier(timeout=10)      # rank 0's timed-out request completed meanwhile
        return float(kv.pull(3)[0])
    with local_cluster(1, 2, van=van, request_timeout=0.5) as c:
        assert c.run(job) == [2.0, 2.0]


def test_requests_issued_on_the_io_thread_with_a_done_callback(van):
    """What ps.mxnet does from MXNet's engine: issue a pushpull on the van's I/O thread and
    learn from a callback that it finished (a multi-chunk, two-server key)."""
    import threading
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(600_000).astype(np.float32) for _ in range(2)]

    def job(kv):
        kv.init(5, np.zeros(600_000, np.float32))
        out = np.empty(600_000, np.float32)
        done, seen = threading.Event(), {}

        def finished(handle):
            seen["thread"] = threading.current_thread().name
            seen["error"] = None
            try:
                handle.wait()
            except ps.PSError as exc:
                seen["error"] = exc
            done.set()
        kv.call_soon(lambda: kv.pushpull(5, grads[kv.rank], out=out, block=False)
                             .add_done_callback(finished))
        assert done.wait(20), "the done callback never ran"
        assert seen["error"] is None, seen
        return out
    with local_cluster(2, 2, van=van, bigarray_bound=1000) as c:
        o0, o1 = c.run(job)
    np.testing.assert_array_equal(o0, grads[0] + grads[1])
    np.testing.assert_array_equal(o1, o0)


def test_requests_issued_together_on_the_io_thread_share_a_message(van):
    """A burst of small pushpulls issued on the I/O thread (MXNet's engine hands a step's
    gradients over together) leaves as one message per server, not one per key."""
    import threading

    def job(kv):
        for k in range(4):
            kv.init(k, np.zeros(8, np.float32))
        sent = []
        real_send = kv._worker._send
        kv._worker._send = lambda sid, box, *flags: (sent.append(len(box.entries)), real_send(sid, box, *flags))
        handles, issued = [], threading.Event()

        def burst():
            handles.extend(kv.pushpull(k, np.full(8, k + 1.0, np.float32), block=False) for k in range(4))
            issued.set()
        kv.call_soon(burst)
        assert issued.wait(10)
        return [h.wait(10)[0] for h in handles], sent
    with local_cluster(2, 2, van=van) as c:      # keys 0 and 2 live on one server, 1 and 3 on the other
        for values, sent in c.run(job):
            assert values == [2.0, 4.0, 6.0, 8.0]
            assert sent == [2, 2], f"entries per message sent: {sent}"


def test_a_lone_call_leaves_from_the_callers_thread_and_a_burst_behind_it_shares_messages(van):
    """Servers on this machine, reached by streams (zmq): a blocking pushpull is written by
    the caller's own thread (no I/O thread hand-off), which reads the reply itself too; a
    burst is batched as before (its first call, made while nothing else was outstanding,
    leaves alone, and so may one made after all before it were answered). Without streams
    (inproc) a caller writes and reads nothing. The sums are the same either way. (A lone
    call goes through the I/O thread when that thread still has something of its own
    queued, e.g. a heartbeat on a loaded machine: so five lone calls, of which one must do.)"""
    def job(kv):
        for k in range(41):
            kv.init(k, np.zeros(8, np.float32))
        kv.barrier()
        before = kv.transport_stats()
        for _ in range(5):
            one = kv.pushpull(40, np.full(8, kv.rank + 1.0, np.float32))
        after_one = kv.transport_stats()
        handles = [kv.pushpull(k, np.full(8, k + kv.rank + 1.0, np.float32), block=False) for k in range(40)]
        values = [h.wait(10)[0] for h in handles]
        after = kv.transport_stats()

        def delta(a, b, name):
            return b.get(name, 0) - a.get(name, 0)
        return (float(one[0]), values, delta(before, after_one, "sent_now"),
                delta(after_one, after, "sent_now"), delta(after_one, after, "messages_sent"),
                delta(before, after_one, "read_here"))
    with local_cluster(2, 2, van=van) as c:
        for one, values, lone_now, burst_now, burst_sent, lone_read in c.run(job):
            assert one == 3.0 and values == [2 * k + 3.0 for k in range(40)]
            if van == "inproc":                 # no streams, and it counts no messages
                assert (lone_now, burst_now, lone_read) == (0, 0, 0)
                continue
            assert 1 <= lone_now <= 5, lone_now
            assert 1 <= lone_read <= lone_now, f"{lone_read} of {lone_now} lone calls read their own reply"
            assert burst_sent <= 10, f"40 small calls in {burst_sent} messages (heartbeats too): not batched"


@pytest.mark.parametrize("window", [0, 1 << 20])
@pytest.mark.parametrize("transport", ["inproc", "zmq-tcp"])
def test_send_window_lets_the_most_urgent_key_overtake_and_sums_stay_exact(transport, window):
    """MXNet's backward order: the last layer's gradient (priority -4) is issued first, the
    first layer's (priority 0) last. In call order (no window) key 0's round closes last;
    with PS_SEND_WINDOW it overtakes the queued bytes of keys 1-3 and closes first (over
    TCP: the window is for network links, ipc:// peers on one machine are not held back)."""
    import threading
    rng = np.random.default_rng(2)
    size = 600_000                                   # 2.4 MB: three chunks
    grads = [[rng.standard_normal(size).astype(np.float32) for _ in range(5)] for _ in range(2)]

    def job(kv):
        for k in range(5):
            kv.init(k, np.zeros(size, np.float32))
        outs = [np.empty(size, np.float32) for _ in range(5)]
        order, lock, issued, handles = [], threading.Lock(), threading.Event(), []

        def finished(k):
            def callback(handle):
                with lock:
                    order.append(k)
            return callback

        def backward():                              # one burst, as MXNet's engine hands it over
            for k in reversed(range(5)):
                handles.append(kv.pushpull(k, grads[kv.rank][k], out=outs[k], priority=-k, block=False))
                handles[-1].add_done_callback(finished(k))
            issued.set()
        kv.call_soon(backward)
        assert issued.wait(10)
        for h in handles:
            h.wait(20)
        return order, outs
    with local_cluster(1, 2, van=transport, send_window=window) as c:
        results = c.run(job)
    for order, outs in results:
        for k in range(5):
            np.testing.assert_array_equal(outs[k], grads[0][k] + grads[1][k])
        if window:
            assert order[0] == 0, f"rounds closed in the order {order}"
        else:
            assert order == [4, 3, 2, 1, 0], f"rounds closed in the order {order}"


def test_send_window_leaves_same_machine_ipc_peers_alone():
    """Over the ipc:// twin (same machine) nothing waits for credits: call order, and no
    CREDIT traffic (it would cost a loopback round trip per message)."""
    def job(kv):
        kv.init(0, np.zeros(300_000, np.float32))
        out = kv.pushpull(0, np.ones(300_000, np.float32))
        return float(out[0]), kv.transport_stats()
    with local_cluster(1, 2, van="zmq", send_window=1 << 20) as c:
        for value, stats in c.run(job):
            assert value == 2.0
            assert stats["credits"] == 0, stats


def test_a_reply_waiting_in_the_servers_send_window_keeps_its_rounds_value():
    """Worker 0 on the server's machine (ipc://, answered at once), worker 1 across a
    "network" (TCP, its replies wait for credits one message at a time). Both pipeline
    push, pull, push, pull... without waiting: rounds close while worker 1's replies still
    wait, and the store must not change in place a value those replies will send."""
    with local_cluster(1, 2, van="zmq", send_window=1,
                       worker_settings=[{}, {"local_ipc": False}]) as c:
        (got0, s0), (got1, s1) = c.run(pipelined_rounds)
    assert got0 == got1 == [(20.0 * r + 3,) * 2 for r in range(6)], got1
    assert s0["credits"] == 0 and s1["credits"] > 0, (s0, s1)


def test_small_messages_over_a_network_leave_uncredited_and_the_sums_are_right():
    """Across a "network" (TCP), messages of at most CREDIT_MIN bytes are not counted in the
    window and ask for no CREDIT: a credit per message cost a small model 3 ms a step across
    hosts. The sums are the same."""
    def job(kv):
        kv.init(list(range(12)), [np.zeros(100 * (k + 1), np.float32) for k in range(12)])
        for step in range(3):
            outs = [kv.pushpull(k, np.full(100 * (k + 1), kv.rank + 1, np.float32), block=False, priority=-k)
                    for k in range(12)]
        return [float(h.wait()[0]) for h in outs], kv.transport_stats()
    with local_cluster(2, 2, van="zmq", send_window=1 << 20, local_ipc=False) as c:
        for sums, stats in c.run(job):
            assert sums == [3.0] * 12, sums
            assert stats["credits"] == 0, stats


def pipelined_rounds(kv, size=1_000_000, rounds=6):
    """Rounds of push then pull of a 4 MB key (four chunks), none waited for until the end:
    the first and last element each pull got, and the transport's counters."""
    kv.init(0, np.zeros(size, np.float32))
    pulls = []
    for r in range(rounds):
        kv.push(0, np.full(size, 10 * r + kv.rank + 1, np.float32))
        pulls.append(kv.pull(0, block=False))
    return [(float(h.wait(20)[0]), float(h.wait(20)[-1])) for h in pulls], kv.transport_stats()


@pytest.mark.parametrize("transport", ["inproc", "zmq", "zmq-tcp"])
def test_pipelined_pushes_and_pulls_of_a_multi_chunk_key_each_see_their_round(transport):
    """push, pull, push, pull... without waiting, a 4 MB key (four chunks). Found broken
    (2026-11-23, every run over zmq): the flush on the I/O thread sent a push's last chunk,
    and the next push, ahead of its first chunks still queued by the caller's thread, so the
    server counted a worker's push in the wrong round (pulls saw 33, 53, 73: sums of two
    rounds); and once sends kept their order, a reply that waited in the van's queue lost
    its copy-on-write guard (pulls saw the next round's value)."""
    with local_cluster(1, 2, van=transport, send_window=0) as c:
        for got, _ in c.run(pipelined_rounds):
            assert got == [(20.0 * r + 3,) * 2 for r in range(6)], got


def test_chunk_bytes_sets_the_message_size_both_ways_and_the_sums_are_the_same():
    """PS_CHUNK_BYTES=128K: the 4 MB key goes to the server and comes back in 128 KiB messages
    (31 a push, 31 a pull, against 4 each), over real sockets, and every pull sees the same
    round's sum as with 1 MiB chunks."""
    runs = {}
    for chunk in (1 << 20, 128 << 10):
        with local_cluster(1, 2, van="zmq", send_window=0, chunk_bytes=chunk) as c:
            runs[chunk] = c.run(pipelined_rounds)
    for chunk, results in runs.items():
        for got, _ in results:
            assert got == [(20.0 * r + 3,) * 2 for r in range(6)], (chunk, got)
    for (_, big), (_, small) in zip(runs[1 << 20], runs[128 << 10]):
        # 6 pushes and 6 pulls: 6 x 31 chunks a way against 6 x 4, plus the few others both have
        assert small["messages_sent"] - big["messages_sent"] >= 6 * (31 - 4) * 0.9, (big, small)
        assert small["messages_received"] - big["messages_received"] >= 6 * (31 - 4) * 0.9, (big, small)


def test_declared_keys_are_made_by_their_first_push_without_any_meeting(van):
    """declare: no message and no barrier. Worker 0 pushes a new key while worker 1 sits at a
    barrier (Horovod's first use of a name); the servers make the key at that push. A big
    key is split over both servers; a pull of a key nobody pushed is refused."""
    big = 3_000_001

    def job(kv):
        kv.declare("early", (4,), np.float32)
        kv.declare("big", (big,), np.float64)
        handles = []
        if kv.rank == 0:
            handles = [kv.pushpull("early", np.ones(4, np.float32), block=False),
                       kv.pushpull("big", np.full(big, 0.5), block=False)]
        kv.barrier(wait=False)             # worker 0's pushes are still in flight
        if kv.rank == 1:
            handles = [kv.pushpull("early", np.full(4, 2.0, np.float32), block=False),
                       kv.pushpull("big", np.full(big, 0.25), block=False)]
        early, whole = (h.wait() for h in handles)
        kv.declare("never_pushed", (2,), np.float32)
        with pytest.raises(ps.RemoteError, match="is not initialized"):
            kv.pull("never_pushed")
        return early.tolist(), float(whole.min()), float(whole.max())
    with local_cluster(2, 2, van=van, bigarray_bound=1000) as c:
        assert c.run(job) == [([3.0] * 4, 0.75, 0.75)] * 2


def test_a_declared_key_lives_on_the_server_given_for_it(van):
    """declare(server=): every worker names the same server for a key below the bigarray
    bound (ps.torch places its gradients by size so: ps.keys.balance). Each key is sent to the
    server its hash does not pick, and the servers hold exactly those bytes."""
    from ps.keys import plan, str_key
    arrays = {"a": np.float32, "b": np.float32, "c": np.float64}
    where = {name: 1 - plan(str_key(name), 10, 2, 1000)[0].server for name in arrays}

    def job(kv):
        for name, dtype in arrays.items():
            kv.declare(name, (10,), dtype, server=where[name])
        sums = [kv.pushpull(name, np.full(10, kv.rank + 1.0, dtype)).tolist() for name, dtype in arrays.items()]
        kv.barrier()
        held = kv.server_command("stats")
        return sums, [held[server]["bytes"] for server in sorted(held)]
    want = [sum(10 * np.dtype(dtype).itemsize for name, dtype in arrays.items() if where[name] == s) for s in (0, 1)]
    with local_cluster(2, 2, van=van, bigarray_bound=1000) as c:
        for sums, held in c.run(job):
            assert sums == [[3.0] * 10] * 3 and held == want, (held, want, where)


def test_a_key_of_some_workers_closes_its_rounds_when_they_pushed(van):
    """init(members=): only those workers push the key; the lowest makes it, the members then
    meet on a key they share; a worker outside them is refused with the members named."""
    def job(kv):
        if kv.rank == 1:
            with pytest.raises(ValueError, match=r"rank 1 is not one of the members \[0, 2\]"):
                kv.init("pair", np.zeros(3, np.float32), members=[0, 2])
            kv.declare("pair", (3,), np.float32)
        else:
            kv.init("pair", np.full(3, 7.0, np.float32), members=[0, 2])
        kv.barrier()                       # "pair" is on the servers, with its members
        if kv.rank == 1:
            with pytest.raises(ps.RemoteError, match=r"pushed only by workers \[0, 2\], not by worker 1"):
                kv.pushpull("pair", np.ones(3, np.float32))
            return None
        return [kv.pushpull("pair", np.full(3, kv.rank + 1.0, np.float32)).tolist() for _ in range(3)]
    with local_cluster(2, 3, van=van) as c:
        first, outside, third = c.run(job)
    assert first == third == [[4.0] * 3] * 3 and outside is None
