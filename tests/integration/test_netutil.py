"""ps.netutil: the one place for interface addresses, routes and free ports. Real sockets
(routes are read by connecting one)."""
import socket
from pathlib import Path

import pytest

from ps.config import Config
from ps.errors import ConfigError
from ps.netutil import free_port, host_ip, interface_addresses, interface_ip, route_source

pytestmark = pytest.mark.process


def test_loopback_interface_by_prefix():
    assert interface_addresses()["lo"] == "127.0.0.1"
    assert interface_ip("l") == "127.0.0.1"


def test_an_unknown_interface_names_the_variable_and_the_interfaces():
    with pytest.raises(ConfigError, match=r"DMLC_INTERFACE='nosuch0'.*interfaces: .*lo"):
        interface_ip("nosuch0")


def test_route_source_to_loopback_and_host_ip():
    assert route_source("127.0.0.1") == "127.0.0.1"
    socket.inet_aton(host_ip())           # an IPv4 address, whatever this machine has


def test_free_port_can_be_bound_and_is_not_an_ephemeral_port():
    """A chosen port that an outgoing connection can take before its listener binds it made
    tests fail; free_port's ports lie below the kernel's ephemeral range."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(20000 <= p < min(low, 32768) for p in ports), sorted(ports)
    assert len(ports) > 10                # random, so two tests rarely pick the same one
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


BASE = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3"}


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
