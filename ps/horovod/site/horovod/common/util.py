"""``horovod.common.util``: the helpers Horovod's own tests import from it."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def env(**variables: str | None) -> Iterator[None]:
    """Set environment variables for the ``with`` block (``None``: leave that one alone), then
    put back what was there, unset what was not: Horovod's tests set ``HOROVOD_TIMELINE`` so
    around ``hvd.init()``."""
    given = {k: v for k, v in variables.items() if v is not None}
    before = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
