"""TableSpec: what every worker declares a table as, and what a server checks the next
declaration of the same name against."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..optim import rowwise
from .hashing import table_key
from .init import Init
from .limits import Limits

CONSISTENCY = ("sync", "async", "ssp:S")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TableSpec:
    """``consistency``: ``sync`` closes a round once every worker pushed, and applies their
    gradients' mean (one process on the whole batch); ``async`` applies each worker's
    gradient as it comes (MXNet's dist_async); ``ssp:S`` (bounded staleness) applies them as
    ``async`` does, but a worker's pull at its clock c (its pushes so far) waits until every
    worker has pushed c - S times: no worker runs more than S steps ahead of the slowest."""

    name: str
    dim: int
    optimizer: rowwise.RowOptimizer = field(default_factory=rowwise.SGD)
    init: Init = field(default_factory=Init)
    consistency: str = "sync"
    dtype: str = "float32"
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a table's name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim <= 0:
            raise ValueError(f"table {self.name!r}: embedding_dim must be an int > 0, got {self.dim!r}")
        if not isinstance(self.optimizer, rowwise.RowOptimizer):
            raise TypeError(f"table {self.name!r}: optimizer must be one of ps.optim.rowwise's "
                            f"({', '.join(c.__name__ for c in rowwise.ROW_OPTIMIZERS.values())}), "
                            f"got {self.optimizer!r:.100}")
        if self.consistency not in CONSISTENCY[:2] and _ssp_bound(self.consistency) is None:
            raise ValueError(f"table {self.name!r}: consistency must be one of {', '.join(CONSISTENCY)} "
                             f"(S a whole number of steps), got {self.consistency!r}")
        if not isinstance(self.limits, Limits):
            raise TypeError(f"table {self.name!r}: limits must be a ps.embed.Limits, got {self.limits!r:.100}")
        if self.dtype not in DTYPES:
            raise ValueError(f"table {self.name!r}: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def staleness(self) -> int | None:
        """``ssp:S``'s S (None under sync and async)."""
        return _ssp_bound(self.consistency)

    @property
    def waits_for_all(self) -> bool:
        """Whether every worker must push every step (sync and ssp) or none waits (async)."""
        return self.consistency != "async"

    @property
    def key(self) -> int:
        return table_key(self.name)

    @staticmethod
    def key_of(name: object) -> int:
        if not isinstance(name, str):
            raise ValueError(f"a table's name must be a str, got {name!r:.100}")
        return table_key(name)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "optimizer": self.optimizer.spec(),
                "init": [self.init.kind, self.init.scale], "consistency": self.consistency, "dtype": self.dtype,
                "limits": self.limits.to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> "TableSpec":
        if not isinstance(body, dict):
            raise ValueError(f"a table declaration is a dict, got {body!r:.100}")
        try:
            kind, scale = body["init"]
            return cls(body["name"], body["dim"], rowwise.from_spec(body["optimizer"]), Init(kind, scale),
                       body["consistency"], body["dtype"], Limits.from_wire(body.get("limits", Limits().to_wire())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed table declaration {body!r:.200}: {exc}") from None

    def mismatch(self, other: "TableSpec") -> str | None:
        """How ``other``, declared under this table's name, differs from it (None: alike)."""
        for what in ("dim", "dtype", "consistency", "optimizer", "init", "limits"):
            mine, theirs = getattr(self, what), getattr(other, what)
            if mine != theirs:
                label = "dimension" if what == "dim" else what
                return (f"table {self.name!r} exists with {label} {mine!r}; this declaration asks for {theirs!r} "
                        "(every worker must declare a table alike)")
        return None


def _ssp_bound(consistency: object) -> int | None:
    if not isinstance(consistency, str) or not consistency.startswith("ssp:"):
        return None
    bound = consistency[4:]
    return int(bound) if bound.isdigit() else None
