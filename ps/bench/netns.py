"""K "hosts" on this machine for the multi-host benchmark: network namespaces on a bridge,
every host's link shaped both ways with ``tc tbf``. Root only.

Safety (the test-infrastructure rule): the subnet is never addressed from the root
namespace. The launcher's own host is a namespace too (host 0, the scheduler), and an
``unreachable`` route for the subnet is in place in the root namespace for as long as the
hosts exist, so a stray connection fails here instead of leaving the machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

SUBNET = "10.79.0"          # distinct from the tests' 10.77.0.x: both may run at once
CC_SYSCTL = "net.ipv4.tcp_congestion_control"
# A namespace made from the root one shares its TCP hash (262,144 buckets on a 24 GB machine),
# and every read of a host's /proc/net/tcp walks all of it: 11 ms a host, which the benchmark's
# connection counts paid at each sample, in the CPU load it reports. A host made from the
# switch's namespace, whose child hash is set small, gets one of its own: 0.25 ms (Linux 6.1+).
CHILD_EHASH_SYSCTL = "net.ipv4.tcp_child_ehash_entries"
HOST_EHASH = 1024


class NamespaceError(RuntimeError):
    pass


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _ip(*args: str) -> None:
    _run(["ip", *args], f"ip {' '.join(args)}")


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise NamespaceError(f"{what}: {proc.stderr.strip()}")


def check_root() -> None:
    """Raise NamespaceError saying why the multi-host benchmark cannot run here."""
    if os.geteuid() != 0:
        raise NamespaceError("python -m ps.bench --hosts needs root (network namespaces and tc); run it as root, "
                             "or without --hosts for the single-machine benchmark")
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            raise NamespaceError(f"python -m ps.bench --hosts needs `{tool}` (iproute2)")


def sysctl_path(name: str) -> str:
    """Where sysctl ``name`` lives: /proc/sys/net is the reading process's namespace's own."""
    return "/proc/sys/" + name.replace(".", "/")


def _proc_sys(name: str) -> str:
    """A sysctl's value in this process's namespace ('' where it cannot be read)."""
    try:
        with open(sysctl_path(name)) as f:
            return f.read().strip()
    except OSError:
        return ""


def congestion_controls() -> list[str]:
    """The TCP congestion controls this kernel offers (loaded modules)."""
    return _proc_sys("net.ipv4.tcp_available_congestion_control").split()


def default_congestion_control() -> str:
    """What a new namespace starts with: the root namespace's setting."""
    return _proc_sys(CC_SYSCTL) or "unknown"


class Hosts:
    """``with Hosts(4, "1gbit") as hosts: hosts.argv(1, [...])``: namespaces ``<prefix>0..K``
    (0: the scheduler's host, unshaped), ``<prefix>sw`` holds the bridge.

    ``tcp``: the hosts' TCP congestion control (``cubic``, Linux's default, or ``bbr``...); None
    keeps the machine's. It decides how well K flows share a shaped link: at K = 4, 1 Gbit/s,
    BBR kept the links 82-85 % busy where cubic kept them 92-94 % (docs/multihost.md)."""

    def __init__(self, count: int, link: str | None, prefix: str = "psbench", burst: str = "256kb",
                 latency: str = "20ms", tcp: str | None = None):
        self.count, self.link, self.prefix, self.burst, self.latency = count, link, prefix, burst, latency
        if tcp is not None and tcp not in congestion_controls():
            raise NamespaceError(f"--tcp {tcp!r}: this kernel offers {' '.join(congestion_controls()) or 'none'} "
                                 f"(`modprobe tcp_{tcp}` may add it)")
        self.tcp = tcp or default_congestion_control()
        self._set_tcp = tcp is not None
        self._made: list[str] = []
        self._route = False
        self._sigterm: list[Any] = []     # the SIGTERM handler before __enter__, while ours is set

    def name(self, host: int) -> str:
        return f"{self.prefix}{host}"

    def ip(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def argv(self, host: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name(host), *argv]

    def switch_argv(self, argv: Sequence[str]) -> list[str]:
        """Run in the switch's namespace, where port ``p<h>`` is host h's link."""
        return ["ip", "netns", "exec", f"{self.prefix}sw", *argv]

    def __enter__(self) -> "Hosts":
        check_root()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM's default ends Python without unwinding, and would leave the namespaces,
            # the safety route and every process in them behind: raise like ^C instead
            self._sigterm = [signal.signal(signal.SIGTERM, _interrupt)]
        try:
            self._up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sigterm:       # a second SIGTERM must not cut the teardown short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.down()
        finally:
            if self._sigterm:
                before = self._sigterm.pop()      # None: set outside Python, taken as the default
                signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)

    def _up(self) -> None:
        _ip("route", "replace", "unreachable", f"{SUBNET.rsplit('.', 1)[0]}.0.0/16", "metric", "4000")
        self._route = True
        sw = f"{self.prefix}sw"
        self.down(quiet=True)
        self._route = True
        _ip("netns", "add", sw)
        self._made.append(sw)
        _ip("-n", sw, "link", "set", "lo", "up")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        own_hash = os.path.exists(sysctl_path(CHILD_EHASH_SYSCTL))
        if own_hash:
            self._sysctl(sw, CHILD_EHASH_SYSCTL, str(HOST_EHASH))
        for host in range(self.count + 1):
            ns = self.name(host)
            if own_hash:        # made from the switch's namespace, for its hash; its mount is the machine's
                _run(["nsenter", f"--net=/run/netns/{sw}", "ip", "netns", "add", ns], f"ip netns add {ns}")
            else:
                _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{host}", "netns", sw)
            _ip("-n", sw, "link", "set", f"p{host}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self._set_tcp:
                self._sysctl(ns, CC_SYSCTL, self.tcp)
            if host and self.link:     # both ways: the host's egress, and the bridge port's (its ingress)
                for where, dev in ((ns, "eth0"), (sw, f"p{host}")):
                    self._tc(where, dev)

    def _sysctl(self, ns: str, name: str, value: str) -> None:
        """Written under ``ip netns exec``: the namespace's own setting."""
        proc = subprocess.run(["ip", "netns", "exec", ns, "tee", sysctl_path(name)], input=value, capture_output=True,
                              text=True, timeout=30)
        if proc.returncode:
            raise NamespaceError(f"{name} = {value} in {ns}: {proc.stderr.strip()}")

    def _tc(self, ns: str, dev: str) -> None:
        proc = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                               "rate", self.link, "burst", self.burst, "latency", self.latency],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode:
            raise NamespaceError(f"tc tbf rate {self.link} on {ns}/{dev}: {proc.stderr.strip()}")

    def down(self, quiet: bool = False) -> None:
        """Kill what runs in our namespaces (only those), delete them, drop the safety route."""
        names = [self.name(h) for h in range(self.count + 1)] + [f"{self.prefix}sw"]
        for ns in names:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made = []
        if self._route and not quiet:
            subprocess.run(["ip", "route", "del", "unreachable", f"{SUBNET.rsplit('.', 1)[0]}.0.0/16",
                            "metric", "4000"], capture_output=True, timeout=30)
            self._route = False

    def link_bytes(self, host: int) -> tuple[int, int]:
        """(received, sent) bytes on the host's eth0 so far."""
        out = subprocess.run(self.argv(host, ["cat", "/proc/net/dev"]), capture_output=True, text=True,
                             timeout=30).stdout
        return net_dev(out).get("eth0", (0, 0))


def net_dev(text: str) -> dict[str, tuple[int, int]]:
    """/proc/net/dev's text: interface -> (received, sent) bytes."""
    counts = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) > 8:
            counts[name.strip()] = (int(fields[0]), int(fields[8]))
    return counts
