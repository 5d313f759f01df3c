"""Addresses: resolve the scheduler's name, pick the address this node announces, the\naddress of an interface, a free port. The one place for these (ps and the launcher)."""
from __future__ import annotations

import fcntl
import socket
import struct

from .config import Config
from .errors import ConfigError

_SIOCGIFADDR = 0x8915


def resolve(host: str, variable: str = "DMLC_PS_ROOT_URI") -> str:
    """Host name or IP -> IPv4 string (ps-lite needs an IP; we accept names too)."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ConfigError(f"{variable}={host!r} does not resolve to an address: {exc}") from None


def interface_ip(prefix: str) -> str:
    """IPv4 address of the first interface whose name starts with ``prefix`` (ps-lite rule)."""
    names = [name for _, name in socket.if_nameindex() if name.startswith(prefix)]
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            return socket.inet_ntoa(packed[20:24])
    raise ConfigError(f"DMLC_INTERFACE={prefix!r}: no interface with an IPv4 address matches "
                      f"(interfaces: {', '.join(n for _, n in socket.if_nameindex())})")


def route_source(target_ip: str, port: int) -> str:
    """The local address the kernel would use to reach ``target_ip`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target_ip, port or 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def announce_host(cfg: Config, scheduler_ip: str) -> str:
    """Address this node binds and announces: DMLC_NODE_HOST, else DMLC_INTERFACE's,
    else the address that routes to the scheduler (so one-host jobs stay on loopback)."""
    if cfg.node_host:
        return resolve(cfg.node_host, "DMLC_NODE_HOST")
    if cfg.interface:
        return interface_ip(cfg.interface)
    return route_source(scheduler_ip, cfg.root_port or 0)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. Only for a process that cannot bind port 0 itself
    and report it (MXNet's native scheduler); anything of ours binds port 0."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
