"""Horovod's timeline file (ps/collective/timeline.py) and how requests are shown on it
(collective.names.timeline_bar); the file's use by ps.torch and ps.mxnet runs in
tests/torch/test_collectives.py and tests/mxnet/test_horovod_mxnet.py."""
import json
import logging
import threading

import pytest

from ps.collective import timeline_bar
from ps.collective.timeline import Bar, Timeline


def bar(key):
    return timeline_bar(key, "ps.torch")


def test_a_closed_timeline_is_json_and_a_cut_one_is_json_once_closed(tmp_path):
    path = tmp_path / "t.json"
    tl = Timeline(str(path), bar, mark_cycles=True)
    ends = [tl.started(f"allreduce.w{i}:3:<f4") for i in range(3)]
    assert tl.started("ps.torch.agree.0") is None            # ps's own keys are not shown
    for end in ends:
        end()
    tl.cycle()
    cut = path.read_text()                                     # as a job that died leaves it
    events = json.loads(cut + "\n]")
    tl.close()
    assert json.loads(path.read_text()) == events
    rows = {e["args"]["name"] for e in events if e["name"] == "process_name" and e["pid"]}
    assert rows == {"allreduce.w0", "allreduce.w1", "allreduce.w2"}
    assert [e["name"] for e in events if e["ph"] == "X"] == ["ALLREDUCE"] * 3
    assert [e["name"] for e in events if e["ph"] == "i"] == ["CYCLE_START"]
    ends[0]()                                                  # a bar that ends after close: not shown
    tl.close()                                                 # idempotent
    assert json.loads(path.read_text()) == events


def test_bars_ending_on_many_threads_while_it_closes_leave_valid_json(tmp_path):
    path = tmp_path / "t.json"
    tl = Timeline(str(path), bar)
    ends = [tl.started(f"broadcast.p{i % 7}:2:<f4") for i in range(400)]
    threads = [threading.Thread(target=lambda part=ends[i::4]: [e() for e in part]) for i in range(4)]
    for t in threads:
        t.start()
    tl.close()
    for t in threads:
        t.join()
    events = json.loads(path.read_text())
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert len({e["pid"] for e in events if e["ph"] == "X"}) <= 7


def test_no_cycles_unless_marked_and_a_full_disk_stops_the_timeline_not_the_job(tmp_path, caplog):
    path = tmp_path / "t.json"
    tl = Timeline(str(path), bar)
    tl.cycle()
    tl.close()
    assert "CYCLE_START" not in path.read_text()
    with caplog.at_level(logging.WARNING, "ps.collective.timeline"):
        full = Timeline("/dev/full", bar, mark_cycles=True)   # every write fails (ENOSPC)
        assert full.started("allreduce.w:3:<f4") is None
        full.cycle()
        full.close()
    assert "timeline /dev/full stopped" in caplog.text


@pytest.mark.parametrize("key,api,names,shown", [
    ("allreduce.w:3:<f4", "ps.torch", "", Bar("allreduce.w", "ALLREDUCE")),
    ("ps.torch.check.allreduce.w", "ps.torch", "", Bar("allreduce.w", "NEGOTIATE_ALLREDUCE")),
    ("set2/allreduce.w:3:<f4", "ps.torch", "", Bar("allreduce.w (process set 2)", "ALLREDUCE")),
    ("allreduce.broadcast.w:2:<f4", "ps.torch", "", Bar("broadcast.w", "BROADCAST")),     # a broadcast made of a sum
    ("allreduce.allgather.x.rows:4:<f8", "ps.torch", "", Bar("allgather.x.rows", "ALLGATHER")),
    ("broadcast.fc.bias:10:<f4", "ps.torch", "", Bar("broadcast.fc.bias", "BROADCAST")),
    ("allreduce.broadcast.root.w:2:<f8", "ps.torch", "", None),                           # the root vote
    ("ps.torch.agree.3", "ps.torch", "", None),
    ("set1/meeting", "ps.torch", "", None),
    ("server.param.0", "ps.torch", "", None),                                             # not a Horovod operation
    (7, "ps.torch", "", None),
    ("hvd.allreduce.v:3:<f4", "ps.mxnet", "hvd.", Bar("allreduce.v", "ALLREDUCE")),
    ("ps.mxnet.check.hvd.allreduce.v", "ps.mxnet", "hvd.", Bar("allreduce.v", "NEGOTIATE_ALLREDUCE")),
    ("hvd.broadcast.root:2:<f8", "ps.mxnet", "hvd.", None),
    ("allreduce.v:3:<f4", "ps.mxnet", "hvd.", None),
])
def test_how_a_request_is_shown(key, api, names, shown):
    assert timeline_bar(key, api, names) == shown
