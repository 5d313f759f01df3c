"""The arrays of DATA messages: the dtypes a key may have, row-sparse data, the batch a
worker's requests (or a server's replies) leave in, and reading a received message's frames.

``Entry.dtype_code`` indexes ``DTYPES``. Each entry that carries values (push/init requests,
pull replies without error) owns the next array frame, sent zero-copy and read back with
``np.frombuffer``; compressed values travel in the layout ps/compression.py gives them.

Row-sparse entries (``Op.ROWS``, ``row_len`` elements per row) move whole rows of a
row-aligned slice: a request carries a frame of uint32 row ids local to the server's slice
(and, for a push, then a frame of those rows' values); ``offset``/``length``/``total``
count rows of the request (a push may come in chunks), while the pull reply counts
elements of the rows asked for, in the order asked. Embedding-table entries (``Op.TABLE``)
are laid out alike, with int64 ids of the table's (any value) instead.

Apart from ps/message.py (the envelope) because of numpy: a scheduler never imports this.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import compression
from .errors import ProtocolError
from .message import WIRE_BITS, Entry, Op, entry_has_data, frame_buffer

DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in (
    "<f4", "<f8", "<f2", "<i4", "<i8", "|u1", "|i1", "<i2"))
DTYPE_CODE = {dt: i for i, dt in enumerate(DTYPES)}


class Rows(NamedTuple):
    """The data of an ``Op.ROWS`` request entry: row ids local to the server's slice, and
    (a push) the values of those rows, ``len(ids) * row_len`` elements."""

    ids: np.ndarray
    values: np.ndarray | None = None


ROW_ID = np.dtype("<u4")
TABLE_ID = np.dtype("<i8")     # Op.TABLE: any int64 id


class Batch:
    """DATA entries (and their frames) gathered for one peer, and their payload bytes: a
    worker's requests or a server's replies that leave in one message."""

    __slots__ = ("entries", "frames", "nbytes")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.frames: list[Any] = []
        self.nbytes = 0

    def add(self, entry: Entry, data: np.ndarray | None) -> int:
        """Append; the payload bytes so far (the caller sends once it passes its limit)."""
        self.entries.append(entry)
        if isinstance(data, Rows):
            self.frames.append(data.ids)
            self.nbytes += data.ids.nbytes
            data = data.values
        if data is not None:
            self.frames.append(data)
            self.nbytes += data.nbytes
        return self.nbytes


_new_entry = tuple.__new__   # decode: skips NamedTuple's argument parsing (2x faster)


def dtype_code(dtype: np.dtype) -> int:
    try:
        return DTYPE_CODE[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"dtype {np.dtype(dtype)} is not supported; use one of "
                        f"{', '.join(str(d) for d in DTYPES)}") from None


def payload_bytes(frames: Sequence[Any]) -> int:
    """The array bytes of a decoded DATA message (a worker's Batch.nbytes for it)."""
    total = 0
    for f in frames:
        if isinstance(f, Rows):
            total += f.ids.nbytes + (f.values.nbytes if f.values is not None else 0)
        else:
            total += f.nbytes
    return total


def _frame_layout(request: bool, op: int, code: int, n: int) -> tuple[np.dtype, int]:
    """dtype and byte size of an entry's frame (compressed values differ from the key's)."""
    if op & WIRE_BITS:
        layout = compression.frame_layout(request, op, n)
        if layout is not None:
            return layout
    dtype = DTYPES[code]
    return dtype, n * dtype.itemsize


def _frame(it: Any, key: int, dtype: np.dtype, n: int) -> np.ndarray:
    """The next frame as ``n`` items of ``dtype``; ProtocolError if missing or of another size."""
    frame = next(it, None)
    if frame is None:
        raise ProtocolError(f"entry for key {key} has no data frame")
    buf = frame_buffer(frame)
    if buf.nbytes != n * dtype.itemsize:
        raise ProtocolError(f"key {key}: frame has {buf.nbytes} bytes, entry says {n} x {dtype}")
    return np.frombuffer(buf, dtype=dtype)


def _rows(it: Any, key: int, op: int, n: int, row_len: int, code: int) -> Rows:
    ids = _frame(it, key, TABLE_ID if op & Op.TABLE else ROW_ID, n)
    if not op & Op.PUSH:
        return Rows(ids)
    return Rows(ids, _frame(it, key, DTYPES[code], n * row_len))


_INTS = frozenset((int,))     # msgpack's integers (a bool is not one here)


def data_arrays(entries: Any, frames: Sequence[Any], request: bool) -> list[np.ndarray]:
    """A DATA body's entries made ``Entry`` records in place, and their frames as arrays
    (``Rows`` for a row-sparse request); ProtocolError for anything the meta does not say."""
    if not isinstance(entries, list):
        raise ProtocolError("DATA body must be a list of entries")
    arrays: list[np.ndarray] = []
    it = iter(frames)
    for i, raw in enumerate(entries):
        if not (isinstance(raw, list) and 8 <= len(raw) <= 11):
            raise ProtocolError(f"malformed entry {raw!r:.100}")
        while len(raw) < 11:
            raw.append(0)
        ts, op, key, off, n, total, code, error, row_len, seq, priority = raw
        if not _INTS.issuperset(map(type, (ts, op, key, off, n, total, code, row_len, seq, priority))) or \
                not (0 <= off and 0 <= n and off + n <= total) or not 0 <= code < len(DTYPES) or \
                (op & (Op.ROWS | Op.TABLE) and row_len <= 0):
            raise ProtocolError(f"malformed entry {raw!r:.100}")
        entries[i] = _new_entry(Entry, raw)
        if not entry_has_data(request, op, error):
            continue
        if request and op & (Op.ROWS | Op.TABLE):
            arrays.append(_rows(it, key, op, n, row_len, code))
            continue
        dtype, nbytes = _frame_layout(request, op, code, n)
        arrays.append(_frame(it, key, dtype, nbytes // dtype.itemsize))
    if next(it, None) is not None:
        raise ProtocolError("more data frames than entries")
    return arrays
