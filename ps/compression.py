"""Gradient compression (pure numpy): everything about it, on both sides of the wire.

``2bit`` is MXNet's scheme, for pushes: the worker keeps a residual per key, sends +t, -t
or 0 per element as 2 bits (element i in byte i//4 at shift 6 - 2*(i%4): 11 = +t, 10 = -t),
and carries the rest to the next push. ``fp16`` (ours) sends float32 gradients as float16
and, unless ``'pull': False``, the pulled values too (``HALF_PULL``): half the bytes both
ways, while the servers sum and update in float32, so rounding does not accumulate there.

One module owns it so the two sides cannot drift: the worker's :class:`Compressor` makes
a request's wire form, :func:`frame_layout` is what the decoder expects of it, and
:func:`decode_push` is what the server merges. The op bits it reads are ``message.Op``'s
(ps/message.py needs no numpy: a scheduler imports it, and never this).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .message import Op

TYPES = ("2bit", "fp16")

Encode = Callable[[np.ndarray], np.ndarray]


class UnsetError(RuntimeError):
    """A push compressed in a way the servers were not told of."""


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


class Compressor:
    """A worker's compression, from ``set_gradient_compression`` on: the parsed params, and
    the residual 2bit carries over per key (new params start with none)."""

    def __init__(self, params: dict[str, Any]):
        self.params = params                    # as parse() returns them
        self._residuals: dict[int, np.ndarray] = {}
        self._two_bit = params["type"] == "2bit"
        self._pull_bits = Op.HALF_PULL if params["pull"] else 0

    def wire(self, key: int, value: np.ndarray | None, pushes: bool,
             pulls: bool) -> tuple[int, np.ndarray | None, Encode | None]:
        """A float32 key's request as it travels: the op bits to add, the pushed value (if
        ``pushes``: quantized, or halved) and what packs each chunk of it (2bit), else None."""
        bits = self._pull_bits if pulls else 0
        if value is None or not pushes:
            return bits, value, None
        if not self._two_bit:
            return bits | Op.FP16, value.astype(np.float16), None
        residual = self._residuals.get(key)
        if residual is None:
            residual = self._residuals[key] = np.zeros(value.size, np.float32)
        return bits | Op.TWO_BIT, quantize_2bit(value, residual, self.params["threshold"]), pack_2bit


def frame_layout(request: bool, op: int, n: int) -> tuple[np.dtype, int] | None:
    """dtype and byte size of the frame of ``n`` elements an entry with ``op`` carries
    (a request, or a reply); None if they travel in the key's own dtype."""
    if request and op & Op.TWO_BIT:
        return np.dtype(np.uint8), packed_nbytes(n)
    if request and op & Op.FP16:
        return np.dtype(np.float16), 2 * n
    if not request and op & Op.HALF_PULL:
        return np.dtype(np.float16), 2 * n
    return None


def decode_push(op: int, data: np.ndarray, n: int, dtype: Any, params: dict[str, Any] | None) -> np.ndarray:
    """A compressed push's ``n`` values as a server merges them (``dtype``: the key's merge
    dtype); ``params``: the servers' compression. A float16 push is merged as it is, after
    a cast. Raises UnsetError for a 2bit push to servers with no 2bit threshold."""
    if op & Op.FP16:
        return data
    if not params or params["type"] != "2bit":
        raise UnsetError("a 2bit-compressed push arrived but the servers have no 2bit compression set")
    return unpack_2bit(data, n, params["threshold"], dtype)
