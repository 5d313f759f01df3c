"""What a collective's keys are called, and how a key reads back to the person who wrote the
script (in an error, on the timeline).

Horovod's collectives have no keys: a tensor is named at the call. Here a name is a key, with
the tensor's shape and dtype in it (``tensor_key``), and a process set's keys stand apart from
every other group's (``group_key``). An error or a timeline row must show the name the script
gave, not that key, so the way back is written here beside the way there.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .timeline import Bar

GROUP_PREFIX = "set"        # a group's keys: "set<id>/<name>", apart from every other group's
VARIANT = "~"               # a reduction's key name: "<name>~sum~pre0.5" (``variant``)
# Horovod's operations, as the first part of a key's name says (a timeline shows only these)
OPERATIONS = ("allreduce", "broadcast", "allgather", "alltoall", "reducescatter", "sparse", "broadcast_object",
              "allgather_object")


def group_key(gid: int, key: str) -> str:
    """The key a group's collective uses for ``key`` (group 0: every worker, the key itself)."""
    return f"{GROUP_PREFIX}{gid}/{key}" if gid else key


def variant(reduce: str, prescale: float = 1.0, postscale: float = 1.0) -> str:
    """What a reduction's key adds to its name besides shape and dtype: how its result is
    made (the op, the scale factors), unless Horovod's default (Average, no scaling). Two
    workers that ask for the same tensor reduced differently then wait on two keys, which
    PS_DEADLOCK_CHECK names, instead of summing into one and each scaling it its own way."""
    tag = "" if reduce == "Average" else f"{VARIANT}{reduce.lower()}"
    tag += f"{VARIANT}pre{prescale!r}" if prescale != 1.0 else ""
    return tag + (f"{VARIANT}post{postscale!r}" if postscale != 1.0 else "")


def plain(base: str) -> str:
    """A key's name without its ``variant``."""
    return base.partition(VARIANT)[0]


def tensor_key(name: str, shape: tuple[int, ...], dtype: Any) -> str:
    """The key a named tensor travels under. As in Horovod, a name may come back later with
    another shape or dtype (two models' ``bias``, an optimizer state's ``momentum_buffer`` of
    every parameter); a ps key has one, so the key is the name with its shape and dtype."""
    return f"{name}:{'x'.join(map(str, shape))}:{np.dtype(dtype).str}"


def base_name(key: str) -> str:
    """A tensor key's name without its shape and dtype (``tensor_key``)."""
    head, _, dtype = key.rpartition(":")
    base, _, shape = head.rpartition(":")
    return base if base and dtype and all(p.isdigit() for p in shape.split("x") if p) else key


def label(key: str) -> str:
    """A key as the script knows it: ``allreduce.w:3:<f4`` is the allreduce of 'w'."""
    key, gid = _split_group(key)
    return _plain_label(key) + (f" in process set {gid}" if gid else "")


def described(key: Any, names: str = "") -> str:
    """A key in a deadlock's MismatchError: ``allreduce of 'w' (shape (3, 4), float32)``;
    a key not made by ``tensor_key`` as it is. ``names``: what the adapter's keys start with."""
    if not isinstance(key, str):
        return f"key {key!r}"
    bare, gid = _split_group(key)
    if names and bare.startswith(names):
        bare = bare[len(names):]
    base = base_name(bare)
    where = f" in process set {gid}" if gid else ""
    if base == bare:
        return f"{key!r}{where}"
    shape_text, _, dtype = bare[len(base) + 1:].partition(":")
    base = _as_operation(base)
    shape = tuple(int(d) for d in shape_text.split("x") if d)
    how = base.partition(VARIANT)[2].replace(VARIANT, ", ")
    kind, _, rest = plain(base).partition(".")
    what = f"the gradient of {rest[len('grad.'):]!r}" if rest.startswith("grad.") else f"{kind} of {rest!r}"
    return f"{what} (shape {shape}, {np.dtype(dtype).name}{', ' + how if how else ''}){where}"


def timeline_bar(key: Any, api: str, names: str = "") -> Bar | None:
    """How Horovod's timeline shows a request on ``key`` of adapter ``api`` (whose tensor keys
    start with ``names``): the tensor's row (``allreduce.w``; ``broadcast.w`` for a broadcast
    made of a sum) and the phase (``ALLREDUCE``; ``NEGOTIATE_ALLREDUCE`` for the check of a
    call's new names, ``api.check.<first name>``). None for what is not a Horovod operation:
    meetings, agreements, a broadcast's root vote, other keys of the store."""
    if not isinstance(key, str):
        return None
    check = f"{api}.check."
    negotiate = key.startswith(check)
    key, gid = _split_group(key[len(check):] if negotiate else key)
    base = plain(base_name(key))
    if not base.startswith(names):
        return None
    base = base[len(names):]
    base = _as_operation(base)
    kind = base.partition(".")[0]
    if kind not in OPERATIONS or base == kind or base.startswith("broadcast.root"):
        return None
    return Bar(base + (f" (process set {gid})" if gid else ""), ("NEGOTIATE_" if negotiate else "") + kind.upper())


def _as_operation(base: str) -> str:
    """ps.torch's broadcast and gathers are sums (``allreduce.broadcast.w``): named by what
    they are (``broadcast.w``)."""
    inner = base.partition(".")[2]
    return inner if base.startswith("allreduce.") and inner.partition(".")[0] in OPERATIONS else base


def _split_group(key: str) -> tuple[str, str | None]:
    """``set2/allreduce.w:3:<f4`` -> (``allreduce.w:3:<f4``, "2"); a key of no group -> (key, None)."""
    if key.startswith(GROUP_PREFIX) and "/" in key:
        gid, _, rest = key[len(GROUP_PREFIX):].partition("/")
        if gid.isdigit():
            return rest, gid
    return key, None


def _plain_label(key: str) -> str:
    kind, _, rest = plain(base_name(key)).partition(".")
    if rest.startswith("grad."):
        return f"{rest[len('grad.'):]!r} (a parameter's gradient)"
    return f"{rest!r} ({kind})"
