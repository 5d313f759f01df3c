"""``horovod.runner.util.threads.in_thread``, which Horovod's test helpers (test/utils/common.py) use."""
from __future__ import annotations

import threading
from typing import Any, Callable


def in_thread(target: Callable[..., Any], args: tuple = (), name: str | None = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a thread and return it. ``silent``: an exception ``target``
    raises ends the thread quietly instead of being printed by threading's hook."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args).__name__} (a single argument is (arg,))")

    def quiet(*a: Any) -> None:
        try:
            target(*a)
        except Exception:  # noqa: BLE001 - silent=True asks for exactly this
            pass
    thread = threading.Thread(target=quiet if silent else target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
