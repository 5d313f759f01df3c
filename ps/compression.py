"""Gradient compression (pure numpy).

``2bit`` is MXNet's scheme, for pushes: the worker keeps a residual per key, sends +t, -t
or 0 per element as 2 bits (element i in byte i//4 at shift 6 - 2*(i%4): 11 = +t, 10 = -t),
and carries the rest to the next push. ``fp16`` (ours) sends float32 gradients as float16
and, unless ``'pull': False``, the pulled values too (``Op.HALF_PULL``): half the bytes both
ways, while the servers sum and update in float32, so rounding does not accumulate there.
"""
from __future__ import annotations

from typing import Any

import numpy as np

TYPES = ("2bit", "fp16")


def parse(params: dict[str, Any]) -> dict[str, Any]:
    """Validate MXNet-style ``{'type': '2bit', 'threshold': 0.5}``."""
    if not isinstance(params, dict) or "type" not in params:
        raise ValueError(f"compression params must be a dict with a 'type', got {params!r}")
    kind = str(params["type"]).lower()
    if kind not in TYPES:
        raise ValueError(f"unknown gradient compression type {params['type']!r}; use one of {TYPES}")
    threshold = float(params.get("threshold", 0.5))
    if kind == "2bit" and not threshold > 0:
        raise ValueError(f"2bit compression needs a threshold > 0, got {threshold}")
    pull = params.get("pull", kind == "fp16")
    if pull not in (True, False):
        raise ValueError(f"compression 'pull' must be True or False, got {pull!r}")
    if pull and kind != "fp16":
        raise ValueError(f"only fp16 compression can halve pulls; {kind} compresses pushes only")
    return {"type": kind, "threshold": threshold, "pull": pull}


def packed_nbytes(n: int) -> int:
    """Bytes of ``n`` 2-bit codes, padded to whole float32 words as MXNet does."""
    return 4 * ((n + 15) // 16)


def quantize_2bit(grad: np.ndarray, residual: np.ndarray, threshold: float) -> np.ndarray:
    """Add ``grad`` to ``residual`` and take at most one +-threshold per element out of it.

    Returns int8 codes (+1, -1, 0); ``residual`` is updated in place.
    """
    residual += grad
    t = residual.dtype.type(threshold)
    codes = np.zeros(residual.shape, np.int8)
    pos = residual >= t
    neg = residual <= -t
    codes[pos] = 1
    codes[neg] = -1
    residual[pos] -= t
    residual[neg] += t
    return codes


def pack_2bit(codes: np.ndarray) -> np.ndarray:
    """int8 codes -> packed uint8 bytes (``packed_nbytes(len(codes))`` of them)."""
    n = codes.size
    bits = np.zeros(packed_nbytes(n) * 4, np.uint8)
    bits[:n][codes > 0] = 3
    bits[:n][codes < 0] = 2
    quads = bits.reshape(-1, 4)
    return (quads[:, 0] << 6) | (quads[:, 1] << 4) | (quads[:, 2] << 2) | quads[:, 3]


def unpack_2bit(packed: np.ndarray, n: int, threshold: float, dtype: Any = np.float32) -> np.ndarray:
    """Packed bytes -> ``n`` values of +-threshold or 0."""
    b = np.asarray(packed, np.uint8)
    bits = np.stack([(b >> 6) & 3, (b >> 4) & 3, (b >> 2) & 3, b & 3], axis=1).reshape(-1)[:n]
    out = np.zeros(n, dtype)
    out[bits == 3] = threshold
    out[bits == 2] = -threshold
    return out
