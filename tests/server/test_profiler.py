"""ps/server/profiler.py on its own: what a server's trace holds and when it is written."""
import json
import time

import pytest

from ps.server.profiler import ServerProfiler


def spans(path):
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


def test_spans_are_written_at_stop_and_kept_until_a_finished_dump(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = ServerProfiler(3, "server 3")
    p.command({"action": "config", "params": {"filename": "s.json", "profile_all": True}})
    assert not p.running
    p.command({"action": "state", "run": True})
    start = time.perf_counter()
    p.record("push", "request", start, {"key": 7})
    p.command({"action": "pause", "paused": True})
    assert not p.running                      # callers skip recording while paused
    p.command({"action": "pause", "paused": False})
    p.record("pull", "request", time.perf_counter())
    info = p.command({"action": "state", "run": False})
    out = tmp_path / "rank3_s.json"
    assert info["file"] == str(out)
    got = spans(out)
    assert [e["name"] for e in got] == ["push", "pull"] and got[0]["args"] == {"key": 7}
    assert got[0]["dur"] >= 0 and got[1]["ts"] >= got[0]["ts"]
    assert abs(got[0]["ts"] / 1e6 - time.time()) < 60      # wall-clock microseconds, as MXNet's traces
    p.command({"action": "dump", "finished": True})        # written again, then cleared
    assert len(spans(out)) == 2
    p.command({"action": "state", "run": True})
    p.record("push", "request", time.perf_counter())
    p.command({"action": "state", "run": False})
    assert len(spans(out)) == 1


@pytest.mark.parametrize("name", ["../evil.json", "/etc/passwd", "a/b.json", ".bashrc", "", 5])
def test_a_filename_that_is_not_a_plain_name_is_refused(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    p = ServerProfiler(0, "server 0")
    with pytest.raises(ValueError, match="plain file name"):
        p.command({"action": "config", "params": {"filename": name}})
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_written_unless_it_ran_and_unknown_actions_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rank0_x.json").write_text("an earlier run's")     # removed at config, as MXNet does
    p = ServerProfiler(0, "server 0")
    p.command({"action": "config", "params": {"filename": "x.json"}})
    p.command({"action": "dump"})
    p.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="'bogus'"):
        p.command({"action": "bogus"})
