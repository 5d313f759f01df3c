"""Where a van's same-machine peers reach it: an ipc:// path in the temporary directory
beside its tcp:// address, and a Unix stream socket beside that path (ps/van/streams.py)."""
from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable

STREAM_SUFFIX = ".s"       # the stream socket's path is the ipc:// path's and this


def new_ipc_path(listen: Callable[[str], None] | None) -> str:
    """A fresh ipc:// path, its stream socket bound first (``listen``, when the van uses
    streams): once the path is in the temporary directory for all to see, no other user
    can take the stream's name."""
    path = os.path.join(tempfile.gettempdir(), f"ps-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if listen is not None:
        listen(path + STREAM_SUFFIX)
    return path


def stream_path(endpoint: str) -> str | None:
    """The stream socket beside a peer's ipc:// endpoint, if the peer's process made it
    (its owner is the ipc:// socket's)."""
    if not endpoint.startswith("ipc://"):
        return None
    twin = endpoint[len("ipc://"):]
    try:
        same = os.stat(twin + STREAM_SUFFIX).st_uid == os.stat(twin).st_uid
    except OSError:
        return None
    return twin + STREAM_SUFFIX if same else None
