"""Embedding tables held by the servers: rows keyed by any int64 id, made on first touch,
updated by a row-wise optimizer where they live (docs/embeddings.md).

* ``hashing``: which server holds an id, a server's slots, a table's seed;
* ``init``: a row's first value from (table, id) alone (``Init``);
* ``index``: ``IdIndex``, int64 id -> row, open addressing in numpy;
* ``limits``: ``Limits`` (capacity, eviction, admission) and the count-min sketch it counts with;
* ``spec``: ``TableSpec``, what every worker declares;
* ``table``: ``RowTable``, one server's rows and their optimizer state;
* ``client``: ``Table``, a worker's pulls and pushes (made by ``KVStore.table``), and
  ``LocalTable`` for a process that runs alone;
* ``checkpoint``: ``save``/``load`` of a table to a directory, onto any number of servers;
* ``serving``: ``export`` of every row for serving, and ``Rows``, its memory-mapped lookup.
"""
from __future__ import annotations

from ..optim import rowwise
from .checkpoint import load, save
from .client import LocalTable, Table
from .init import Init, initial_rows
from .limits import Limits
from .serving import Rows, export
from .spec import TableSpec

__all__ = ["Init", "Limits", "LocalTable", "Rows", "Table", "TableSpec", "export", "initial_rows", "load", "rowwise",
           "save"]
