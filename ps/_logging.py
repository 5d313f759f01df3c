"""PS_VERBOSE -> log level for the ``ps`` loggers (a handler only if the app set none)."""
from __future__ import annotations

import logging
import sys


def setup(verbose: int, prefix: str = "") -> None:
    root = logging.getLogger("ps")
    root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG))
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
