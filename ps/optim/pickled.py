"""MXNet optimizers ps has no numpy version of, in an authenticated job.

The worker pickles the MXNet optimizer by value (cloudpickle) and signs it with a key
derived from PS_SECRET_FILE; the server checks the signature *before* unpickling, so only a
member of the authenticated cluster can make a server run code (PS_ALLOW_PICKLE=0 refuses
even that). The server then imports mxnet
(with DMLC_ROLE hidden, or mxnet would start its own C++ server) and runs MXNet's updater.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import sys
from typing import Any

import numpy as np


def sign(payload: bytes, key: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def load_optimizer(payload: bytes, signature: bytes, key: bytes) -> Any:
    if not hmac.compare_digest(sign(payload, key), bytes(signature)):
        raise PermissionError("the pickled optimizer's signature does not match this cluster's secret")
    mx = import_mxnet()
    opt = pickle.loads(payload)          # noqa: S301 - signed by a cluster member, operator opted in
    if not isinstance(opt, mx.optimizer.Optimizer):
        raise TypeError(f"expected an mx.optimizer.Optimizer, got {type(opt).__name__}")
    return opt


def import_mxnet() -> Any:
    """mxnet, imported with DMLC_ROLE hidden: its import runs MXNet's native server or
    scheduler for any role but ``worker`` (a server, a joint process) and never returns."""
    if "mxnet" in sys.modules:
        return sys.modules["mxnet"]
    role = os.environ.pop("DMLC_ROLE", None)
    try:
        import mxnet
        return mxnet
    finally:
        if role is not None:
            os.environ["DMLC_ROLE"] = role


class MXNetUpdater:
    """MXNet's own updater behind the server's ``updater(key, grad, weight)`` call."""

    elementwise = False     # MXNet's updater takes whole arrays

    def __init__(self, optimizer: Any):
        self.mx = import_mxnet()
        self.optimizer = optimizer
        self._updater = self.mx.optimizer.get_updater(optimizer)

    def __call__(self, key: int, grad: np.ndarray, weight: np.ndarray) -> None:
        w = self.mx.nd.array(weight, dtype=weight.dtype)
        self._updater(key, self.mx.nd.array(grad, dtype=weight.dtype), w)
        weight[:] = w.asnumpy()

    def update_rows(self, key: int, rows: np.ndarray, grad: np.ndarray, weight: np.ndarray) -> None:
        """MXNet's optimizer on a row_sparse gradient: its own lazy or dense rule applies."""
        mx = self.mx
        w = mx.nd.array(weight, dtype=weight.dtype)
        g = mx.nd.sparse.row_sparse_array((grad.astype(weight.dtype, copy=False), rows), shape=weight.shape,
                                          dtype=weight.dtype)
        self._updater(key, g, w)
        weight[:] = w.asnumpy()

    def begin(self, key: int, weight: np.ndarray) -> None:
        raise TypeError("MXNet's own updater is not elementwise: it cannot update in chunks")

    def update_chunk(self, key: int, offset: int, grad: np.ndarray, weight: np.ndarray) -> None:
        self.begin(key, weight)

    def get_states(self) -> bytes:
        return self._updater.get_states(dump_optimizer=False)

    def set_states(self, data: bytes) -> None:
        self._updater.set_states(data)
