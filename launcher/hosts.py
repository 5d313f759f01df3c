"""Hostfiles and process placement (pure: no I/O besides reading the file).

A hostfile is dmlc-core's: one host per line, blank lines and ``#`` comments skipped::

    10.0.0.1              # ssh port from ~/.ssh/config (usually 22)
    10.0.0.2:2222         # ssh port 2222
    10.0.0.3 slots=4      # MPI style; slots are accepted and ignored (as dmlc)
    10.0.0.4 role=server  # runs servers only (role=worker: workers only)

Placement is dmlc's when no host is marked: servers first, process ``i`` (0-based over
servers then workers) runs on ``hosts[i % len(hosts)]``. With marks, each role goes round
robin over its own hosts: servers over the hosts marked ``role=server`` (if none is, the
unmarked ones), workers over the hosts marked ``role=worker`` and the unmarked ones. Machines
with network and CPU but no accelerator then hold the servers, and each worker host sends
and receives its model once per step instead of 2(K-1)/K times.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_SLOTS = re.compile(r"^slots=(\d+)$")
_ROLE = re.compile(r"^role=(\w+)$")
ROLES = ("server", "worker")


class HostfileError(ValueError):
    """A hostfile line could not be parsed; the message names the line."""


@dataclass(frozen=True)
class Host:
    """One hostfile entry. ``port`` is the ssh port, None = ssh's default."""

    name: str
    port: int | None = None
    slots: int | None = None
    role: str | None = None      # "server" or "worker": the host runs only that role's processes

    @property
    def key(self) -> tuple[str, int | None]:
        """Identity for "one action per distinct host" (rsync)."""
        return (self.name, self.port)


@dataclass(frozen=True)
class Task:
    """One process of the job: its role, rank within the role, dmlc task id and host."""

    role: str  # "server" or "worker"
    rank: int
    task_id: int
    host: Host | None = None

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank}"


def parse_host_line(line: str, where: str = "hostfile") -> Host | None:
    """Parse one line; None for a blank or comment line."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    words = text.split()
    hostport, extra = words[0], words[1:]
    slots = role = None
    for word in extra:
        m, r = _SLOTS.match(word), _ROLE.match(word)
        if r:
            role = r.group(1)
            if role not in ROLES:
                raise HostfileError(f"{where}: role must be server or worker, got {line.strip()!r}")
            continue
        if not m:
            raise HostfileError(f"{where}: expected 'host', 'host:port', 'host slots=N' or 'host role=server', "
                                f"got {line.strip()!r}")
        slots = int(m.group(1))
        if slots < 1:
            raise HostfileError(f"{where}: slots must be >= 1, got {line.strip()!r}")
    name, port = hostport, None
    if hostport.count(":") == 1:  # host:port (an IPv6 address has several colons)
        name, raw = hostport.split(":")
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise HostfileError(f"{where}: bad ssh port {raw!r} in {line.strip()!r}")
        port = int(raw)
    if not name:
        raise HostfileError(f"{where}: empty host name in {line.strip()!r}")
    return Host(name, port, slots, role)


def parse_hostfile(text: str, where: str = "hostfile") -> list[Host]:
    """Parse a whole hostfile; raises HostfileError if it names no host."""
    hosts = []
    for n, line in enumerate(text.splitlines(), 1):
        host = parse_host_line(line, f"{where}:{n}")
        if host is not None:
            hosts.append(host)
    if not hosts:
        raise HostfileError(f"{where}: no hosts in the file")
    return hosts


def read_hostfile(path: str) -> list[Host]:
    with open(path, encoding="utf-8") as f:
        return parse_hostfile(f.read(), path)


def hosts_for(role: str, hosts: Sequence[Host]) -> list[Host]:
    """The hosts ``role``'s processes may run on (the module's docstring says the rule)."""
    if role == "server":
        return [h for h in hosts if h.role == "server"] or [h for h in hosts if h.role is None]
    return [h for h in hosts if h.role != "server"]


def check_roles(hosts: Sequence[Host], num_servers: int, where: str = "hostfile") -> None:
    """Raise HostfileError when a role with processes to place has no host left for it."""
    if num_servers and not hosts_for("server", hosts):
        raise HostfileError(f"{where}: every host is marked role=worker: no host for the {num_servers} server(s); "
                            "mark some role=server or leave some unmarked")
    if not hosts_for("worker", hosts):
        raise HostfileError(f"{where}: every host is marked role=server: no host for the workers; "
                            "add the workers' hosts (unmarked or role=worker)")


def place(num_servers: int, num_workers: int, hosts: Sequence[Host] | None = None) -> list[Task]:
    """Servers first (task ids 0..S-1), then workers; each on its host (no hosts: None)."""
    if hosts and any(h.role for h in hosts):
        on = {role: hosts_for(role, hosts) for role in ROLES}
        return [Task(role, rank, task_id, on[role][rank % len(on[role])])
                for task_id, (role, rank) in enumerate([("server", r) for r in range(num_servers)]
                                                       + [("worker", r) for r in range(num_workers)])]
    tasks = []
    for i in range(num_servers + num_workers):
        role, rank = ("server", i) if i < num_servers else ("worker", i - num_servers)
        host = hosts[i % len(hosts)] if hosts else None
        tasks.append(Task(role, rank, i, host))
    return tasks


def distinct(hosts: Iterable[Host | None]) -> list[Host]:
    """Hosts in first-seen order, one per (name, port)."""
    seen: dict[tuple[str, int | None], Host] = {}
    for host in hosts:
        if host is not None and host.key not in seen:
            seen[host.key] = host
    return list(seen.values())


def is_loopback(name: str) -> bool:
    return name == "localhost" or name.startswith("127.") or name == "::1"
