"""ps's ``horovod`` package (ps/horovod/site/horovod) and the launcher's choice to put it on
PYTHONPATH (PS_HOROVOD): a real Horovod is not shadowed unless asked. In one process, no
sockets: the package is imported from its directory, and forgotten again after each test."""
import os
import sys
import threading

import pytest

from launcher.launch import parse_args
from launcher.tracker import job_env
from ps.config import ConfigError, value_of
from ps.horovod import HOROVOD_PATH, installed_horovod, wanted
from ps.horovod.__main__ import main as path_command


@pytest.fixture
def shim(monkeypatch):
    """``import horovod`` finds ps's package; every ``horovod`` module is forgotten afterwards."""
    monkeypatch.syspath_prepend(HOROVOD_PATH)
    yield
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        del sys.modules[name]


@pytest.fixture
def real_horovod(tmp_path, monkeypatch):
    """A stand-in for an installed Horovod: a ``horovod`` package on sys.path."""
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "horovod"


def test_ps_horovod_parses_auto_1_and_0():
    assert value_of("PS_HOROVOD", {}) == "auto"
    assert [value_of("PS_HOROVOD", {"PS_HOROVOD": v}) for v in ("AUTO", "1", "yes", "0", "off")] == \
        ["auto", "1", "1", "0", "0"]
    with pytest.raises(ConfigError, match="PS_HOROVOD must be auto, 1 or 0, got 'maybe'"):
        value_of("PS_HOROVOD", {"PS_HOROVOD": "maybe"})


def test_auto_adds_the_package_only_where_no_horovod_is_installed(real_horovod, monkeypatch):
    assert installed_horovod([HOROVOD_PATH]) is None             # ps's own package does not count
    assert installed_horovod() == str(real_horovod / "__init__.py")
    assert not wanted({}) and not wanted({"PS_HOROVOD": "0"})
    assert wanted({"PS_HOROVOD": "1"})                           # asked: shadow it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(real_horovod.parent)])
    assert installed_horovod() is None and wanted({}) and not wanted({"PS_HOROVOD": "0"})


def test_the_launcher_puts_the_package_after_the_mxnet_hook(real_horovod, monkeypatch):
    from ps.mxnet_autoload import MXNET_AUTOLOAD
    spec = parse_args(["-n", "1", "python", "x.py"], {})
    env = {"PYTHONPATH": "/mine"}
    assert job_env(spec, "h", 1, env)["PYTHONPATH"] == f"{MXNET_AUTOLOAD}:/mine"      # Horovod installed
    assert job_env(spec, "h", 1, {**env, "PS_HOROVOD": "1"})["PYTHONPATH"] == f"{MXNET_AUTOLOAD}:{HOROVOD_PATH}:/mine"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(real_horovod.parent)])
    assert job_env(spec, "h", 1, env)["PYTHONPATH"] == f"{MXNET_AUTOLOAD}:{HOROVOD_PATH}:/mine"
    assert job_env(spec, "h", 1, {**env, "PS_HOROVOD": "0"})["PYTHONPATH"] == f"{MXNET_AUTOLOAD}:/mine"
    assert job_env(spec, "h", 1, {"PS_HOROVOD": "1", "PS_MXNET_AUTOLOAD": "0"})["PYTHONPATH"] == HOROVOD_PATH
    assert "PYTHONPATH" not in job_env(spec, "h", 1, {"PS_HOROVOD": "0", "PS_MXNET_AUTOLOAD": "0"})


def test_python_m_ps_horovod_path(capsys):
    assert path_command(["--path"]) == 0
    assert capsys.readouterr().out == HOROVOD_PATH + "\n"
    assert path_command([]) == 78
    assert "usage: python -m ps.horovod --path" in capsys.readouterr().err


def test_horovod_torch_is_ps_torch(shim):
    pytest.importorskip("torch")
    import horovod.torch as hvd
    import horovod.torch.elastic
    import horovod.torch.mpi_ops
    from horovod.torch.elastic.sampler import ElasticSampler
    from horovod.torch.elastic.state import TorchState

    import ps.torch
    assert hvd.__file__.startswith(HOROVOD_PATH)
    for name in ps.torch.__all__:
        if name != "elastic":
            assert getattr(hvd, name) is getattr(ps.torch, name), name
    assert hvd.elastic is horovod.torch.elastic and hvd.elastic.run is ps.torch.elastic.run
    assert ElasticSampler is ps.torch.elastic.ElasticSampler and TorchState is ps.torch.elastic.TorchState
    assert horovod.torch.mpi_ops.synchronize is ps.torch.synchronize


def test_horovods_helpers(shim, monkeypatch):
    import horovod
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    from horovod.common.util import env
    from horovod.runner.util.threads import in_thread

    from ps.errors import CollectiveError
    assert HorovodInternalError is CollectiveError and issubclass(HostsUpdatedInterrupt, RuntimeError)
    assert HostsUpdatedInterrupt(True).skip_sync is True
    with pytest.raises(NotImplementedError, match="python -m ps.launch -n N -s S"):
        horovod.run(print, np=2)

    monkeypatch.setenv("PS_TEST_KEPT", "before")
    monkeypatch.delenv("PS_TEST_NEW", raising=False)
    with env(PS_TEST_KEPT="inside", PS_TEST_NEW="new", PS_TEST_NONE=None):
        assert (os.environ["PS_TEST_KEPT"], os.environ["PS_TEST_NEW"]) == ("inside", "new")
        assert "PS_TEST_NONE" not in os.environ
    assert os.environ["PS_TEST_KEPT"] == "before" and "PS_TEST_NEW" not in os.environ

    got = []
    thread = in_thread(got.append, (7,), name="ps-test-in-thread")
    thread.join(5)
    assert got == [7] and thread.daemon and thread.name == "ps-test-in-thread"
    with pytest.raises(ValueError, match="args must be a tuple, not int"):
        in_thread(got.append, 7)
    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    in_thread(lambda: 1 / 0, silent=True).join(5)
    in_thread(lambda: 1 / 0).join(5)
    assert len(seen) == 1 and seen[0].exc_type is ZeroDivisionError     # silent: the first said nothing
