"""Zero-edit Horovod scripts: a small ``horovod`` package of ps's own (``site/horovod``) whose
``horovod.torch`` is ``ps.torch`` and whose ``horovod.mxnet`` is ``ps.mxnet``'s Horovod API,
with the few helpers Horovod's users and test suites import beside them.

Its parent directory, :data:`HOROVOD_PATH`, goes first on ``PYTHONPATH``: ``python -m ps.launch``
puts it there (``PS_HOROVOD``: ``auto``, the default, only when no installed Horovod would be
found, so a real Horovod is not shadowed unless asked; ``1`` always; ``0`` never); for a bare
``mpirun``/``srun``, ``PYTHONPATH=$(python -m ps.horovod --path)``. Importing this module loads
neither torch nor mxnet: the launcher reads it.
"""
from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Mapping, Sequence

from ..config import value_of

HOROVOD_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def installed_horovod(path: Sequence[str] | None = None) -> str | None:
    """Where ``import horovod`` would find a Horovod that is not ps's (on ``path``, default
    this Python's ``sys.path``), or None."""
    others = [p for p in (sys.path if path is None else path)
              if os.path.abspath(p or os.curdir) != HOROVOD_PATH]
    spec = importlib.machinery.PathFinder.find_spec("horovod", others)
    if spec is None:
        return None
    return spec.origin or next(iter(spec.submodule_search_locations or []), "horovod")


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher puts :data:`HOROVOD_PATH` on its processes' ``PYTHONPATH``
    (``PS_HOROVOD``)."""
    mode = value_of("PS_HOROVOD", environ)
    return mode == "1" or (mode == "auto" and installed_horovod() is None)
