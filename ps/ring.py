"""Which server keeps whose replica (PS_MAX_RESTARTS): the ring, fixed when the cluster forms.

Each server keeps the only copy of the server before it in the ring. A machine that dies
takes all of its servers with it, so two servers of one machine must not be neighbours:
the scheduler orders the ring so that, wherever it can, neighbours run on different hosts.
The launcher's dmlc placement (rank r on host r mod H) already does, and so does a job on
one host (nothing to gain): the ring is then rank order. A job whose ranks were sorted by
host (started by hand, without DMLC_RANK) gets its hosts interleaved.
"""
from __future__ import annotations

import collections
from typing import Sequence


def order(hosts: Sequence[str]) -> list[int]:
    """The ring of server ranks, given each rank's host (``hosts[rank]``)."""
    ranks = list(range(len(hosts)))
    groups = collections.defaultdict(list)
    for rank, host in enumerate(hosts):
        groups[host].append(rank)
    # largest group first, laid on the even places and then the odd ones: no two of a group
    # meet, the ring's ends included, whenever no host runs more than half of the servers
    laid = [r for group in sorted(groups.values(), key=lambda g: (-len(g), g[0])) for r in group]
    ring = [0] * len(laid)
    places = [*range(0, len(laid), 2), *range(1, len(laid), 2)]
    for place, rank in zip(places, laid):
        ring[place] = rank
    return ring if _shared(ring, hosts) < _shared(ranks, hosts) else ranks


def _shared(ring: Sequence[int], hosts: Sequence[str]) -> int:
    """How many neighbour pairs of ``ring`` run on one host."""
    n = len(ring)
    if n < 2:
        return 0
    pairs = [(ring[i], ring[(i + 1) % n]) for i in range(n if n > 2 else 1)]
    return sum(hosts[a] == hosts[b] for a, b in pairs)


def neighbours(ring: Sequence[int], rank: int) -> tuple[int, int]:
    """(primary, backup) of ``rank``: the server whose copy it keeps, and the one keeping its copy."""
    at = list(ring).index(rank)
    return ring[at - 1], ring[(at + 1) % len(ring)]


def valid(ring: object, num_servers: int) -> bool:
    """Whether ``ring`` (from a node table) orders every server rank once."""
    return isinstance(ring, list) and sorted(ring) == list(range(num_servers)) \
        and all(isinstance(r, int) for r in ring)
