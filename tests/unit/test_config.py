import pytest

from ps.config import VARIABLES, Config
from ps.errors import ConfigError

BASE = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3"}


def test_defaults_and_required():
    cfg = Config.from_env(BASE)
    assert (cfg.role, cfg.num_servers, cfg.num_workers, cfg.root_port) == ("worker", 2, 3, 9000)
    assert cfg.heartbeat_interval == 1.0 and cfg.heartbeat_timeout == 30.0
    assert cfg.bigarray_bound == 1_000_000 and cfg.connect_timeout == 120.0
    assert cfg.resend is False and cfg.resend_timeout == 1000


@pytest.mark.parametrize("missing", ["DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"])
def test_missing_required_names_variable(missing):
    env = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        Config.from_env(env)


@pytest.mark.parametrize("var,value", [("DMLC_NUM_SERVER", "two"), ("DMLC_NUM_WORKER", "0"),
                                       ("DMLC_PS_ROOT_PORT", "70000"), ("DMLC_ROLE", "Server"),
                                       ("PS_RESEND", "maybe"), ("PS_PORT_RANGE", "9100"),
                                       ("PS_HEARTBEAT_TIMEOUT", "-1"), ("PS_DROP_MSG", "150"),
                                       ("MXNET_KVSTORE_BIGARRAY_BOUND", "1e6")])
def test_bad_value_names_variable_and_value(var, value):
    with pytest.raises(ConfigError) as err:
        Config.from_env({**BASE, var: value})
    assert var in str(err.value) or var == "PS_DROP_MSG"
    assert value in str(err.value) or "150" in str(err.value)


def test_port_aliases_and_range():
    assert Config.from_env({**BASE, "DMLC_PORT": "7001"}).port == 7001
    assert Config.from_env({**BASE, "DMLC_PORT": "7001", "PORT": "7002"}).port == 7002
    assert Config.from_env({**BASE, "PS_PORT_RANGE": "9100-9200"}).port_range == (9100, 9200)


def test_port_zero_only_for_scheduler():
    with pytest.raises(ConfigError, match="DMLC_PS_ROOT_PORT"):
        Config.from_env({**BASE, "DMLC_PS_ROOT_PORT": "0"})
    assert Config.from_env({**BASE, "DMLC_PS_ROOT_PORT": "0", "DMLC_ROLE": "scheduler"}).root_port == 0


def test_heartbeat_timeout_must_exceed_interval():
    with pytest.raises(ConfigError, match="PS_HEARTBEAT_TIMEOUT"):
        Config.from_env({**BASE, "PS_HEARTBEAT_INTERVAL": "5", "PS_HEARTBEAT_TIMEOUT": "6"})


def test_every_variable_maps_to_a_field():
    fields = set(Config.__dataclass_fields__)
    assert {v.field for v in VARIABLES} <= fields


def test_interface_and_node_host():
    from ps import netutil
    cfg = Config.from_env({**BASE, "DMLC_INTERFACE": "lo"})
    assert netutil.announce_host(cfg, "127.0.0.1") == "127.0.0.1"
    cfg = Config.from_env({**BASE, "DMLC_INTERFACE": "nosuchnic"})
    with pytest.raises(ConfigError, match="DMLC_INTERFACE='nosuchnic'"):
        netutil.announce_host(cfg, "127.0.0.1")
    cfg = Config.from_env({**BASE, "DMLC_NODE_HOST": "localhost", "DMLC_INTERFACE": "nosuchnic"})
    assert netutil.announce_host(cfg, "127.0.0.1") == "127.0.0.1"
    assert netutil.announce_host(Config.from_env(BASE), "127.0.0.1") == "127.0.0.1"
