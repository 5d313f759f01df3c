"""Where the zero-edit MXNet hook lives (``ps/mxnet/autoload/sitecustomize.py``), named
without importing ``ps.mxnet``: that import loads mxnet, which the launcher must not do."""
from __future__ import annotations

import os

MXNET_AUTOLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet", "autoload")
