"""ps/server/imports.py without a cluster: commands held while an optimizer's slow module
imports, run in order once it is in, and an import that takes long is named while it lasts."""
import logging
import sys
import threading

import pytest

from ps.message import Command, Message
from ps.optim import SGD
from ps.optim.base import REGISTRY
from ps.server.imports import SlowImports

SLOW = "ps_test_held_import_module"


class HeldSGD(SGD):
    modules = (SLOW,)


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    (tmp_path / f"{SLOW}.py").write_text("import time\ntime.sleep(0.8)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "heldsgd", HeldSGD)
    monkeypatch.delitem(sys.modules, SLOW, raising=False)
    yield
    sys.modules.pop(SLOW, None)


def command(body):
    return Message(Command.SERVER_CMD, sender=9, recver=8, body=body)


@pytest.mark.timeout(30)
def test_commands_wait_for_the_import_in_order_and_a_long_one_is_named(slow_module, caplog):
    handled, released = [], threading.Event()

    def call_soon(fn):      # the I/O thread's queue, here run at once on the import's thread
        fn()
        released.set()

    imports = SlowImports(call_soon, handled.append, allow_pickle=False, warn_after=0.25, name=lambda: "S[8]")
    first = command({"cmd": "set_optimizer", "spec": {"name": "heldsgd", "params": {}}})
    second = command({"cmd": "get_optimizer"})
    with caplog.at_level(logging.WARNING, logger="ps.server.imports"):
        assert imports.hold(first) and imports.hold(second)     # both wait
        assert released.wait(10), "the held commands were never released"
    assert handled == [first, second] and SLOW in sys.modules
    warned = [r.getMessage() for r in caplog.records]
    assert warned and all(f"S[8]: importing {SLOW} for an optimizer has taken" in w for w in warned), warned
    assert "2 command(s) wait for it" in warned[0], warned
    assert not imports.hold(command({"cmd": "set_optimizer", "spec": {"name": "heldsgd", "params": {}}}))


def test_a_command_needing_no_slow_module_runs_at_once():
    imports = SlowImports(lambda fn: fn(), lambda msg: None, allow_pickle=False)
    assert not imports.hold(command({"cmd": "set_optimizer", "spec": {"name": "sgd", "params": {}}}))
    assert not imports.hold(command({"cmd": "anything"}))
