"""Addresses: resolve the scheduler's name, pick the address a node announces, an
interface's address, a free port. The one place for these, in ps and in the launcher."""
from __future__ import annotations

import logging
import random
import socket
import time
from typing import Callable

import psutil

from .config import Config
from .errors import ConfigError

logger = logging.getLogger(__name__)


def resolve(host: str, variable: str = "DMLC_PS_ROOT_URI", within: float = 0.0,
            clock: Callable[[], float] = time.monotonic) -> str:
    """Host name or IP -> IPv4 string (ps-lite needs an IP; we accept names too). With
    ``within`` seconds, a name that does not resolve yet is tried again until then: in
    Kubernetes a Service's or pod's DNS record appears seconds after the pod starts."""
    end = clock() + within
    pause = 0.1
    while True:
        try:
            return socket.gethostbyname(_ascii(host))
        except OSError as exc:
            if clock() + pause > end:
                waited = f" (tried for {within:g}s: PS_CONNECT_TIMEOUT)" if within else ""
                raise ConfigError(f"{variable}={host!r} does not resolve to an address{waited}: {exc}") from None
            if pause == 0.1:
                logger.warning("%s=%r does not resolve yet (%s); trying again for up to %gs (PS_CONNECT_TIMEOUT)",
                               variable, host, exc, within)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def _ascii(host: str) -> str | bytes:
    """An ASCII name as bytes: the socket module encodes a ``str`` with the IDNA codec, whose
    import (with stringprep) costs every node ~8 ms of start-up for nothing."""
    try:
        return host.encode("ascii")
    except UnicodeEncodeError:
        return host


def interface_addresses() -> dict[str, str]:
    """Interface name -> its first IPv4 address, in the kernel's interface order."""
    found = {name: next((a.address for a in addrs if a.family == socket.AF_INET), None)
             for name, addrs in psutil.net_if_addrs().items()}
    return {name: found[name] for _, name in socket.if_nameindex() if found.get(name)}


def interface_ip(prefix: str, variable: str = "DMLC_INTERFACE") -> str:
    """IPv4 address of the first interface whose name starts with ``prefix`` (ps-lite rule)."""
    addresses = interface_addresses()
    match = next((ip for name, ip in addresses.items() if name.startswith(prefix)), None)
    if match is None:
        raise ConfigError(f"{variable}={prefix!r}: no interface with an IPv4 address matches "
                          f"(interfaces: {', '.join(n for _, n in socket.if_nameindex())})")
    return match


def route_source(target_ip: str, port: int = 9) -> str:
    """The local address the kernel would use to reach ``target_ip`` (a UDP connect sends
    nothing). Raises OSError when there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target_ip, port or 9))
        return s.getsockname()[0]


def host_ip() -> str:
    """This machine's address for peers elsewhere: its host name's, else the first
    non-loopback interface's, else 127.0.0.1."""
    try:
        ip = socket.gethostbyname(_ascii(socket.gethostname()))
    except OSError:
        ip = "127.0.0.1"
    if not ip.startswith("127."):
        return ip
    return next((a for a in interface_addresses().values() if not a.startswith("127.")), ip)


def announce_host(cfg: Config, scheduler_ip: str) -> str:
    """Address this node binds and announces: DMLC_NODE_HOST, else DMLC_INTERFACE's,
    else the address that routes to the scheduler (so one-host jobs stay on loopback)."""
    if cfg.node_host:
        return resolve(cfg.node_host, "DMLC_NODE_HOST")
    if cfg.interface:
        return interface_ip(cfg.interface)
    try:
        return route_source(scheduler_ip, cfg.root_port or 0)
    except OSError:
        return "127.0.0.1"


def listen_ports(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on; psutil.Error when it is gone (NoSuchProcess) or /proc
    hides its sockets from us (the callers decide what either means to them)."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


# Ports for a listener whose number is chosen before it binds. They lie under Linux's default
# ephemeral range (32768-60999), where any process's outgoing connection may take a port at
# any moment; a port here is taken only by someone binding it on purpose.
CHOSEN_PORTS = range(20000, 32000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, from CHOSEN_PORTS. Only for a process that cannot
    bind port 0 itself and report it (MXNet's native scheduler, a scheduler started by hand);
    anything of ours that can binds port 0."""
    for _ in range(200):
        port = random.choice(CHOSEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} in {CHOSEN_PORTS.start}-{CHOSEN_PORTS.stop - 1} after 200 tries")
