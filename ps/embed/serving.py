"""An embedding table for serving: every row as one sorted id array and one row matrix, read
back memory-mapped by ``Rows``, with no cluster, no torch and no ps process.

``export`` gathers a table's rows from its servers (as a checkpoint's save does, without the
optimizer state) into ``ids.npy`` (int64, sorted) and ``rows.npy`` (n x dim), with
``table.json`` naming the table. ``Rows.lookup`` finds ids by binary search; an id the table
never held gets the row training would have made for it (a function of table and id alone,
ps/embed/init.py), so serving and training agree on it, or zeros, or an error, as asked.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .hashing import name_seed
from .init import initial_rows
from .spec import TableSpec

FORMAT = 1
MISSING = ("init", "zeros", "error")


def export(table: Any, path: str | os.PathLike) -> int:
    """Write every row of ``table`` (a ``KVStore.table``, a ``LocalTable``, or a ps.torch
    module's ``table()``) to the new directory ``path``; the rows written."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=False)
    ids, values = [], []
    for chunk in table.chunks(changed_only=False):
        ids.append(chunk.ids)
        values.append(chunk.values)
    spec = table.spec
    all_ids = np.concatenate(ids) if ids else np.empty(0, np.int64)
    rows = np.concatenate(values) if values else np.empty((0, spec.dim), spec.np_dtype)
    order = np.argsort(all_ids, kind="stable")
    np.save(out / "ids.npy", all_ids[order])
    np.save(out / "rows.npy", rows[order])
    (out / "table.json").write_text(json.dumps({"format": FORMAT, "kind": "serving", "spec": spec.to_wire(),
                                               "rows": len(all_ids)}))
    return len(all_ids)


class Rows:
    """An exported table, memory-mapped: ``lookup(ids)`` gives their rows. ``missing``: what
    an id the table did not hold gets: ``"init"`` (its initial row, as training would make
    it), ``"zeros"``, or ``"error"`` (KeyError naming the first few)."""

    def __init__(self, path: str | os.PathLike, missing: str = "init"):
        src = Path(path)
        if missing not in MISSING:
            raise ValueError(f"missing must be one of {', '.join(MISSING)}, got {missing!r}")
        try:
            meta = json.loads((src / "table.json").read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{src} holds no exported table (no table.json)") from None
        if meta.get("kind") != "serving" or meta.get("format") != FORMAT:
            raise ValueError(f"{src} is not a serving export of format {FORMAT} (ps.embed.export); "
                             f"a checkpoint loads with ps.embed.load")
        self.spec = TableSpec.from_wire(meta["spec"])
        self.missing = missing
        self.ids = np.load(src / "ids.npy", mmap_mode="r", allow_pickle=False)
        self.rows = np.load(src / "rows.npy", mmap_mode="r", allow_pickle=False)
        if self.ids.dtype != np.int64 or self.rows.shape != (len(self.ids), self.spec.dim):
            raise ValueError(f"{src}: ids {self.ids.dtype} {self.ids.shape} and rows {self.rows.shape} do not make "
                             f"a table of dimension {self.spec.dim}")

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, ids: Any) -> np.ndarray:
        """The rows of ``ids`` (any shape of int64; the result has one more axis, of the
        table's dimension)."""
        want = np.asarray(ids)
        if want.dtype.kind not in "iu":
            raise TypeError(f"table {self.spec.name!r}: ids must be integers, got dtype {want.dtype}")
        flat = want.reshape(-1).astype(np.int64)
        at = np.searchsorted(self.ids, flat)
        found = at < len(self.ids)
        found[found] = self.ids[at[found]] == flat[found]
        out = np.empty((len(flat), self.spec.dim), self.spec.np_dtype)
        out[found] = self.rows[at[found]]
        if not found.all():
            lost = flat[~found]
            if self.missing == "error":
                raise KeyError(f"table {self.spec.name!r} holds no row for {len(lost)} of the ids, e.g. "
                               f"{lost[:5].tolist()}")
            out[~found] = (initial_rows(name_seed(self.spec.name), lost, self.spec.dim, self.spec.init,
                                        self.spec.np_dtype) if self.missing == "init" else 0)
        return out.reshape(*want.shape, self.spec.dim)
