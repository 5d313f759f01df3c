"""What a server holds of each embedding table besides its rows (ps/server/tables.py moves it,
ps/server/tablejournal.py copies it to the backup): the rounds' pushes as their chunks come,
the ssp pulls that wait, the counts a restart must get back."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..embed.spec import TableSpec
from ..embed.table import RowTable
from ..frames import Rows
from ..message import Entry


@dataclass
class Push:
    """One worker's push to one round, as its chunks come."""

    entry: Entry                           # its first chunk: what the answer names
    ids: list[np.ndarray] = field(default_factory=list)
    grads: list[np.ndarray] = field(default_factory=list)
    rows: int = 0
    came: float = field(default_factory=time.monotonic)

    @property
    def complete(self) -> bool:
        return self.rows >= self.entry.total


class Held(NamedTuple):
    """An ssp pull that waits until the slowest worker is close enough."""

    sender: int
    entry: Entry
    data: Rows
    came: float


@dataclass
class Served:
    spec: TableSpec
    rows: RowTable
    code: int
    rounds: dict[int, dict[int, Push]] = field(default_factory=dict)    # seq -> worker -> push
    closed: int = 0                        # sync rounds closed (they close in order)
    exporting: np.ndarray | None = None    # the rows of the save under way in id order (fixed at its first chunk)
    save_began: int | None = None          # the rows' update count when the save under way began
    clocks: dict[int, int] = field(default_factory=dict)     # async, ssp: worker -> its pushes applied
    held: list[Held] = field(default_factory=list)            # ssp: pulls of workers too far ahead
