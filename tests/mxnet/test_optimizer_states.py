"""ps/mxnet/optimizer.py without a cluster: the optimizer-states file goes back to the
servers it came from, and only to a store of the same namespace and server count; MXNet's
server command 0 is unpickled in the script's process (a stand-in for ``ps.KVStore``)."""
import pickle

import pytest

mx = pytest.importorskip("mxnet")
pytestmark = pytest.mark.mxnet


class Servers:
    """Stands in for ``ps.KVStore``: servers 8 and 10, each keeping the states it is given."""

    def __init__(self, num_servers=2):
        self.num_servers = num_servers
        self.states = {8: {"w": [1.0]}, 10: {"v": [2.0]}}
        self.calls = []

    def server_command(self, cmd, payload=None, servers=None, namespace=0):
        self.calls.append((cmd, servers, namespace))
        if cmd == "get_states":
            return dict(self.states)
        self.states[servers[0]] = payload["states"]
        return {servers[0]: None}


def test_states_saved_from_a_namespace_load_back_into_the_same_servers(tmp_path):
    from ps.mxnet.optimizer import load_states, save_states
    saved, fname = Servers(), str(tmp_path / "states")
    save_states(saved, fname, 1)
    restored = Servers()
    restored.states = {}
    load_states(restored, fname, 1)
    assert restored.states == saved.states
    assert sorted(restored.calls) == [("set_states", [8], 1), ("set_states", [10], 1)]


def test_a_states_file_of_another_namespace_or_server_count_is_refused(tmp_path):
    from ps.mxnet.optimizer import load_states, save_states
    fname = str(tmp_path / "states")
    save_states(Servers(), fname, 0)
    with pytest.raises(ValueError, match="kvstore number 1 .* this is number 2"):
        load_states(Servers(), fname, 1)
    with pytest.raises(ValueError, match="holds states of 2 servers; this job has 3"):
        load_states(Servers(3), fname, 0)
    (tmp_path / "other").write_bytes(b"\x81\xa1a\x01")
    with pytest.raises(ValueError, match="is not a ps optimizer-states file"):
        load_states(Servers(), str(tmp_path / "other"), 0)


def test_server_command_0_is_a_pickled_optimizer_and_nothing_else():
    from ps.mxnet.optimizer import optimizer_in_command
    sgd = optimizer_in_command(0, pickle.dumps(mx.optimizer.SGD(learning_rate=0.25)).decode("latin-1"))
    assert isinstance(sgd, mx.optimizer.SGD) and sgd.lr == 0.25
    with pytest.raises(mx.base.MXNetError, match="needs a pickled mx.optimizer.Optimizer, got dict"):
        optimizer_in_command(0, pickle.dumps({"lr": 1}))
    with pytest.raises(mx.base.MXNetError, match="no MXNet server command 3"):
        optimizer_in_command(3, "")
