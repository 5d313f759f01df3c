"""A backup server's copy of another server's state, kept by replaying its changes.

With ``PS_MAX_RESTARTS`` > 0 each server is the backup of the one before it in a ring
(its *primary*; ps/ring.py). The primary records every change of its store as
:class:`ps.server.events.Event`s: the sums a round applied, never the workers' pushes, so a backup
receives one push's worth of bytes per round, not one per worker. The backup replays them with the same optimizer code on the
same inputs, so its copy is bit-identical to the primary's as of the last closed round.
A round's chunk sums are held until its close event and then applied together: a copy
never holds half a round, whatever moment the primary dies at.

A restarted server fetches its state from its backup (:func:`restore`). Nothing is
unpickled: events are msgpack metadata plus raw arrays whose dtype and size are checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import optim
from ..errors import ProtocolError
from ..frames import DTYPES
from .events import Event, Joins, Replays
from .store import Store
from .tables import Tables
from .updaters import Optimizers, apply_rows

TABLE_EVENTS = frozenset({"tdeclare", "tstate", "tdata", "trows", "tevict", "tsavebegin", "tsaved", "tput"})
BULK = frozenset({"key", "tdata"})      # a snapshot's events that travel one per message

# dtypes an event array may have: the key dtypes plus int64 row ids and uint64 update counts
_ARRAY_DTYPES = (*DTYPES, np.dtype("<i8"), np.dtype("<u4"), np.dtype("<u8"))
_ARRAY_CODE = {dt: i for i, dt in enumerate(_ARRAY_DTYPES)}


# -- wire ------------------------------------------------------------------------------------
def encode_events(events: list[Event]) -> tuple[list[Any], list[np.ndarray]]:
    """(msgpack-able body, frames): each event as [kind, key, offset, info, [(code, size)...]]."""
    body, frames = [], []
    for ev in events:
        layout = []
        for arr in ev.arrays:
            arr = np.ascontiguousarray(arr).reshape(-1)
            layout.append([_ARRAY_CODE[arr.dtype], arr.size])
            frames.append(arr)
        body.append([ev.kind, ev.key, ev.offset, ev.info, layout])
    return body, frames


def decode_events(body: Any, frames: list[Any]) -> list[Event]:
    """Raises ProtocolError if the metadata and the frames disagree."""
    if not isinstance(body, list):
        raise ProtocolError("replica events must be a list")
    it = iter(frames)
    events = []
    for raw in body:
        if not (isinstance(raw, list) and len(raw) == 5 and isinstance(raw[0], str)
                and isinstance(raw[1], int) and isinstance(raw[2], int) and isinstance(raw[4], list)):
            raise ProtocolError(f"malformed replica event {raw!r:.100}")
        kind, key, offset, info, layout = raw
        arrays = []
        for item in layout:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                    and isinstance(item[1], int) and 0 <= item[0] < len(_ARRAY_DTYPES) and item[1] >= 0):
                raise ProtocolError(f"malformed replica array {item!r:.100}")
            dtype = _ARRAY_DTYPES[item[0]]
            frame = next(it, None)
            if frame is None or memoryview(frame).nbytes != item[1] * dtype.itemsize:
                raise ProtocolError(f"replica event {kind} of key {key}: frame size does not match")
            arrays.append(np.frombuffer(frame, dtype=dtype))
        events.append(Event(kind, key, offset, info, tuple(arrays)))
    if next(it, None) is not None:
        raise ProtocolError("more replica frames than events")
    return events


# -- what a snapshot holds -------------------------------------------------------------------
def updater_events(opts: Optimizers, compression: Any) -> list[Event]:
    """The optimizers (spec and states, per namespace), which keys are in which namespace,
    and compression, as events. Raises ValueError for an optimizer ps cannot replicate
    (MXNet's own, pickled)."""
    events = []
    for ns, updater in sorted(opts.updaters.items()):
        if not isinstance(updater, optim.Updater):
            raise ValueError(f"the servers run a pickled MXNet optimizer ({type(updater.optimizer).__name__}), "
                             "which ps cannot replicate; use one ps has in numpy (docs/optimizers.md)")
        events.append(Event("opt", ns, 0, [updater.optimizer.to_spec(), opts.multi.get(ns, False)]))
        events.append(Event("states", ns, 0, updater.get_states()))
    for ns, keys in sorted(opts.by_namespace().items()):
        events.append(Event("ns", ns, 0, keys))
    if compression is not None:
        events.append(Event("compression", 0, 0, compression))
    return events


def members_events(members: dict[int, frozenset[int]]) -> list[Event]:
    """Which keys only some workers push, as events (one per set of workers)."""
    by_group: dict[frozenset[int], list[int]] = {}
    for key, group in members.items():
        by_group.setdefault(group, []).append(key)
    return [Event("members", 0, 0, [keys, sorted(group)]) for group, keys in by_group.items()]


def state_events(opts: Optimizers, compression: Any, members: dict[int, frozenset[int]], replays: Replays,
                 joins: Joins) -> list[Event]:
    """A snapshot's events other than the keys': a store's and a backup's copy alike."""
    return [*updater_events(opts, compression), *members_events(members), Event("workers", 0, 0, replays.info()),
            Event("joins", 0, 0, joins.info())]


def key_event(key: int, state: Any, value: np.ndarray) -> Event:
    """A key's value and counts (``state``: a store's KeyState or a copy's MirrorKey)."""
    return Event("key", key, 0, [state.dtype_code, state.closed, list(state.applied.items()),
                                 list(state.excused.items())], (value,))


def snapshot(store: Store, tables: Tables | None = None) -> list[Event]:
    """Everything a backup needs to mirror ``store`` and ``tables`` (call between rounds: see
    half_applied)."""
    events = state_events(store.opts, store.compression, store.members, store.replays, store.joins)
    events += [key_event(ks.key, ks, ks.value.copy()) for ks in store.keys.values() if ks.ready]
    return events + (tables.snapshot() if tables is not None else [])


def restore(store: Store, events: list[Event], tables: Tables | None = None) -> None:
    """Fill a restarted server's empty store and tables from its backup's snapshot."""
    opts = Optimizers()
    for ev in events:
        if ev.kind in TABLE_EVENTS:
            if tables is None:
                raise ProtocolError("the replica holds embedding tables and no table store was given")
            tables.replay(ev)
        elif ev.kind == "key":
            code, closed, applied, excused = ev.info
            store.restore_key(ev.key, code, ev.arrays[0].copy(), closed, {int(w): int(s) for w, s in applied},
                              {int(w): int(n) for w, n in excused})
        elif ev.kind == "opt":
            opts.set(ev.key, optim.Updater(optim.from_spec(ev.info[0])), bool(ev.info[1]))
        elif ev.kind == "states" and ev.key in opts.updaters:
            opts.updaters[ev.key].set_states(ev.info)
        elif ev.kind == "ns":
            store.set_namespace(list(ev.info), ev.key)
        elif ev.kind == "members":
            store.set_members([int(k) for k in ev.info[0]], [int(w) for w in ev.info[1]])
        elif ev.kind == "compression":
            store.compression = ev.info
        elif ev.kind == "workers":
            store.restarts.apply(ev)
        elif ev.kind == "joins":
            store.quorum.apply(ev)
    for ns, updater in opts.updaters.items():
        store.set_updater(updater, opts.multi[ns], ns)


# -- the backup's copy -------------------------------------------------------------------------
@dataclass
class MirrorKey:
    value: np.ndarray
    dtype_code: int
    closed: int = 0
    applied: dict[int, int] = field(default_factory=dict)
    chunks: list[tuple[int, np.ndarray]] = field(default_factory=list)   # the open round's sums
    excused: dict[int, int] = field(default_factory=dict)   # joined worker -> rounds closed without it


class Mirror:
    """A primary server's state as its backup holds it."""

    def __init__(self, primary: int):
        self.primary = primary
        self.keys: dict[int, MirrorKey] = {}
        self.opts = Optimizers()
        self.compression: Any = None
        self.members: dict[int, frozenset[int]] = {}
        self.events = 0
        self.broken: str | None = None      # a change it cannot replay arrived (the copy is useless)
        self.replays = Replays()            # the primary's restarted workers (ps/server/events.py)
        self.joins = Joins()                # the workers in join, as the primary sees them
        self.tables = Tables(0, copy=True)  # its embedding tables

    def apply(self, events: list[Event]) -> None:
        for ev in events:
            self.events += 1
            handler = self._HANDLERS.get(ev.kind)
            if handler is None:
                raise ProtocolError(f"unknown replica event {ev.kind!r}")
            handler(self, ev)

    def snapshot(self) -> list[Event]:
        """This copy as the events :func:`restore` reads (the open rounds' sums left out)."""
        events = state_events(self.opts, self.compression, self.members, self.replays, self.joins)
        return events + [key_event(key, mk, mk.value) for key, mk in self.keys.items()] + self.tables.snapshot()

    def hand_over(self) -> list[Event]:
        """The copy for the primary's restart (:meth:`snapshot`), and this copy made equal to
        it. The restart does the open rounds again from their first chunk (the workers resend
        their pushes), and the changes it then sends here (``_continue``) carry those rounds'
        chunks anew: the dead primary's chunks still queued here would be applied with them
        when the round closes, an optimizer step twice on those offsets."""
        events = self.snapshot()
        for mk in self.keys.values():
            mk.chunks.clear()
        return events

    def nbytes(self) -> int:
        return sum(mk.value.nbytes for mk in self.keys.values()) + self.tables.nbytes()

    # -- replay: the same calls the primary's Store made, on the same inputs -----------------
    def _key(self, ev: Event) -> MirrorKey:
        mk = self.keys.get(ev.key)
        if mk is None:
            raise ProtocolError(f"replica event {ev.kind} for key {ev.key}, which the replica does not hold")
        return mk

    def _on_init(self, ev: Event) -> None:
        code, _total = ev.info
        self.keys[ev.key] = MirrorKey(ev.arrays[0].copy(), code)

    def _on_key(self, ev: Event) -> None:
        code, closed, applied, excused = ev.info
        self.keys[ev.key] = MirrorKey(ev.arrays[0].copy(), code, closed, {int(w): int(s) for w, s in applied},
                                      excused={int(w): int(n) for w, n in excused})

    def _on_chunk(self, ev: Event) -> None:
        self._key(ev).chunks.append((ev.offset, ev.arrays[0].copy()))

    def _on_close(self, ev: Event) -> None:
        mk = self._key(ev)
        chunks, mk.chunks = mk.chunks, []
        updater = self.opts.updater(ev.key)
        if chunks and updater is not None:
            updater.begin(ev.key, mk.value)
        for off, total in chunks:
            if updater is None:
                np.copyto(mk.value[off:off + total.size], total, casting="unsafe")
            else:
                updater.update_chunk(ev.key, off, total, mk.value)
        mk.closed = ev.info

    def _on_whole(self, ev: Event) -> None:
        self._updater(ev.key)(ev.key, ev.arrays[0], self._key(ev).value)

    def _on_dense(self, ev: Event) -> None:
        mk, updater = self._key(ev), self.opts.updater(ev.key)
        if updater is None:
            np.copyto(mk.value, ev.arrays[0], casting="unsafe")
        else:
            updater(ev.key, ev.arrays[0], mk.value)

    def _on_rows(self, ev: Event) -> None:
        mk, row_len = self._key(ev), ev.info
        apply_rows(self.opts.updater(ev.key), ev.key, mk.value.reshape(-1, row_len), ev.arrays[0],
                   ev.arrays[1].reshape(-1, row_len))

    def _on_async(self, ev: Event) -> None:
        mk = self._key(ev)
        worker, seq, _ = ev.info
        self._updater(ev.key)(ev.key, ev.arrays[0], mk.value)
        if seq:
            mk.applied[worker] = seq

    def _on_arows(self, ev: Event) -> None:
        mk = self._key(ev)
        worker, seq, row_len = ev.info
        self._updater(ev.key).update_rows(ev.key, ev.arrays[0], ev.arrays[1].reshape(-1, row_len),
                                          mk.value.reshape(-1, row_len))
        if seq:
            mk.applied[worker] = seq

    def _on_opt(self, ev: Event) -> None:        # key: the namespace
        self.opts.set(ev.key, optim.Updater(optim.from_spec(ev.info[0])), bool(ev.info[1]))

    def _on_states(self, ev: Event) -> None:
        self._optimizer_of(ev.key).set_states(ev.info)

    def _on_ns(self, ev: Event) -> None:
        self.opts.assign(ev.info, ev.key)

    def _on_members(self, ev: Event) -> None:
        group = frozenset(int(w) for w in ev.info[1])
        self.members.update((int(k), group) for k in ev.info[0])

    def _on_params(self, ev: Event) -> None:
        opt = self._optimizer_of(ev.key).optimizer
        if "learning_rate" in ev.info:
            opt.set_learning_rate(float(ev.info["learning_rate"]))
        if "rescale_grad" in ev.info:
            opt.rescale_grad = float(ev.info["rescale_grad"])

    def _on_compression(self, ev: Event) -> None:
        self.compression = ev.info

    def _on_unreplicable(self, ev: Event) -> None:
        self.broken = str(ev.info)

    def _on_workers(self, ev: Event) -> None:
        self.replays = Replays.from_info(ev.info)

    def _on_replays(self, ev: Event) -> None:
        self.replays.apply(ev)

    def _on_joins(self, ev: Event) -> None:
        self.joins = Joins.from_info(ev.info)

    def _on_join(self, ev: Event) -> None:
        self.joins.apply(ev)

    def _on_leave(self, ev: Event) -> None:
        self.joins.apply(ev)
        worker = int(ev.info[0])
        for mk in self.keys.values():
            mk.excused.pop(worker, None)

    def _on_excused(self, ev: Event) -> None:
        mk = self._key(ev)
        for worker, rounds in ev.info:
            mk.excused[int(worker)] = mk.excused.get(int(worker), 0) + int(rounds)

    def _on_table(self, ev: Event) -> None:
        self.tables.replay(ev)

    def _updater(self, key: int) -> Any:
        return self._optimizer_of(self.opts.namespace(key))

    def _optimizer_of(self, ns: int) -> Any:
        updater = self.opts.updaters.get(ns)
        if updater is None:
            raise ProtocolError(f"replica event needs an optimizer (namespace {ns}) the replica does not have")
        return updater

    _HANDLERS = {
        "init": _on_init, "key": _on_key, "chunk": _on_chunk, "close": _on_close, "whole": _on_whole,
        "dense": _on_dense, "rows": _on_rows, "async": _on_async, "arows": _on_arows, "opt": _on_opt,
        "states": _on_states, "ns": _on_ns, "members": _on_members, "params": _on_params, "compression": _on_compression,
        "unreplicable": _on_unreplicable, "workers": _on_workers, "died": _on_replays,
        "caught_up": _on_replays, "setting": _on_replays, "joins": _on_joins, "join": _on_join,
        "leave": _on_leave, "excused": _on_excused, **dict.fromkeys(TABLE_EVENTS, _on_table),
    }

