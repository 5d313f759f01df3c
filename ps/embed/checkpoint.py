"""Saving an embedding table to a directory and loading it back, onto any number of servers.

One worker drives it (the tables are on the servers; the directory is on that worker's
machine): the rows come in chunks of about 8 MB, server by server, and go to one ``.npz``
file each, with their optimizer state and the table's step count; ``table.json`` says what
table it is. A load sends each row to the server that holds its id now, so a table saved from
S servers loads onto S' of them. An incremental save holds only the rows updated since the
previous save; loading the full save and then the incremental ones in order gives the table
as of the last.

Files are read with ``allow_pickle=False``: a checkpoint is data, never code.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from .spec import TableSpec
from .table import Chunk

FORMAT = 1

logger = logging.getLogger(__name__)


def save(table: Any, path: str | os.PathLike, incremental: bool = False) -> int:
    """Write ``table``'s rows (all, or with ``incremental`` those updated since its last save)
    to the new directory ``path``; the rows written. A restarted worker re-running its script
    skips a save its dead self completed (``path`` holds this table's save): the table has
    trained on since, and those rows do not belong under that save's name; one its dead self
    began and did not finish is made again."""
    out = Path(path)
    restarted = table.restarted
    done = _complete(out, table.spec.name) if restarted else None
    if done is not None:
        logger.warning("%s holds the save of table %r this worker's dead self made: not saved again (a restart "
                       "re-running its script)", out, table.spec.name)
        # ends the servers' hold on evictions in case its dead self died before it did; as
        # abandoned, not completed: the save the servers have under way may be a later one its
        # dead self died in, whose start must not count as saved
        table.mark_saved(completed=False)
        return done
    if restarted and _partial(out):
        # its dead self died in this save; under sync the table has not moved since (this
        # worker had not pushed the next step), so the save is made again, whole
        logger.warning("%s holds part of a save this worker's dead self did not finish: saving it again", out)
        for part in out.iterdir():
            part.unlink()
        out.rmdir()
    out.mkdir(parents=True, exist_ok=False)
    rows, parts, steps = 0, 0, 0
    try:
        for chunk in table.chunks(changed_only=incremental):
            steps = max(steps, chunk.steps)
            if not len(chunk.ids):
                continue
            np.savez(out / f"rows-{parts:05d}.npz", ids=chunk.ids, values=chunk.values,
                     **{f"state_{k}": v for k, v in chunk.state.items()})
            rows, parts = rows + len(chunk.ids), parts + 1
        (out / "table.json").write_text(json.dumps({"format": FORMAT, "spec": table.spec.to_wire(), "rows": rows,
                                                   "parts": parts, "steps": steps, "incremental": incremental}))
    except BaseException:
        # the servers hold evictions while a save is under way: let them go (best effort:
        # the cluster may be what failed), and count nothing as saved
        with contextlib.suppress(Exception):
            table.mark_saved(completed=False)
        raise
    table.mark_saved()
    return rows


def _complete(path: Path, name: str) -> int | None:
    """The rows of a whole save of table ``name`` in ``path``, or None."""
    try:
        meta = json.loads((path / "table.json").read_text())
    except (OSError, ValueError):
        return None
    spec = meta.get("spec") if isinstance(meta, dict) else None
    return int(meta["rows"]) if isinstance(spec, dict) and spec.get("name") == name else None


def _partial(path: Path) -> bool:
    """``path`` holds nothing but a save's row files (no table.json): a save cut short."""
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return False
    return all(re.fullmatch(r"rows-\d{5}\.npz", n) for n in names)


def load(table: Any, path: str | os.PathLike) -> int:
    """Put the rows saved in ``path`` into ``table`` (the same dimension and dtype; an optimizer
    that keeps the same state, its hyper-parameters may differ); the rows loaded."""
    src = Path(path)
    try:
        meta = json.loads((src / "table.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{src} holds no saved table (no table.json)") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{src}: checkpoint format {meta.get('format')!r}, this ps reads {FORMAT}")
    saved = TableSpec.from_wire(meta["spec"])
    for what in ("dim", "dtype"):
        if getattr(saved, what) != getattr(table.spec, what):
            raise ValueError(f"{src}: the saved table {saved.name!r} has {what} {getattr(saved, what)!r}; table "
                             f"{table.spec.name!r} has {getattr(table.spec, what)!r}")
    rows = 0
    for i in range(meta["parts"]):
        with np.load(src / f"rows-{i:05d}.npz", allow_pickle=False) as f:
            state = {k[len("state_"):]: f[k] for k in f.files if k.startswith("state_")}
            chunk = Chunk(f["ids"], f["values"], state, meta["steps"])
        table.put(chunk)
        rows += len(chunk.ids)
    if not meta["parts"]:       # no rows, but the step count still counts
        widths = table.spec.optimizer.state(table.spec.dim)
        table.put(Chunk(np.empty(0, np.int64), np.empty((0, table.spec.dim), table.spec.np_dtype),
                        {k: np.empty((0, w), table.spec.np_dtype) for k, (w, _) in widths.items()}, meta["steps"]))
    if rows != meta["rows"]:
        raise ValueError(f"{src}: table.json says {meta['rows']} rows, its files hold {rows}")
    return rows
