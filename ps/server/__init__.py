"""The server role (``DMLC_ROLE=server``): a server's keys, their rounds, and its replica.

The rest of ``ps`` starts a server (``ps/__main__.py``, ``ps.testing``) and nothing more,
so this package exports only :class:`KVServer`, and for a process that is a server alone
:func:`keep_freed` (its malloc); everything else here serves it. The modules, each with
one job:

* ``kvserver``: :class:`KVServer`, the role: requests in, the Store's replies to the
  outbox, server commands, stall warnings;
* ``replies``: how replies leave (per worker, windowed across a network), and the outbox
  the server hands them to;
* ``store``: :class:`Store`, a server's keys and their sync/async rules (pure: no sockets,
  no threads), with the helpers it owns:
  ``quorum`` (who must push to a round), ``values`` (the arithmetic of a round's sums, and
  replies that read a value), ``restarts`` (restarted workers' replays);
* ``rounds``: the records a Store moves (a key's state, its open rounds, the requests they
  hold) and the replies made of a value;
* ``updaters``: the optimizer a Store runs per namespace, and a row-sparse round's update;
* ``events``: what a Store journals for its backup, and the records of restarted and
  joined workers that both copies keep;
* ``bufguard``: the copy-on-write rule for values lent to zero-copy replies;
* ``profiler``: a server's own Chrome trace (MXNet's ``profile_process='server'``);
* ``imports``: imports of seconds an optimizer needs (torch, mxnet), off the I/O thread;
* ``tables``: :class:`Tables`, a server's embedding tables (ps/embed) and their rounds,
  with what they journal for the backup; a backup's copy of them is a ``Tables`` too;
* ``replica``: a backup's copy of another server's Store and Tables, kept by replaying its events;
* ``replication``: the protocol around that copy (PS_MAX_RESTARTS), and the outbox that
  holds replies until the backup has what they depend on;
* ``malloc``: a server process's malloc keeps a round's freed buffers for the next round
  (PS_SERVER_MALLOC_KEEP).
"""
from __future__ import annotations

from .kvserver import KVServer
from .malloc import keep_freed

__all__ = ["KVServer", "keep_freed"]
