"""A Horovod-style job as both framework adapters (``ps.torch``, ``ps.mxnet``'s Horovod calls)
see it: one numpy ``KVStore`` per process, who this process is, and named sums.

A tensor's name is a key (ps/collective/names.py), declared by each worker the first time it
uses it (the servers make it at its first push, so nobody waits for anybody). Every worker must
ask for the same names with the same shapes in the same order; ``ensure_keys`` checks that with
a sum beside the first pushes, so a script whose workers disagree gets an error naming the
tensor instead of a sync round that never closes. Groups (Horovod's process sets) are the same
over some of the workers.
"""
from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Callable

import numpy as np

from ..config import value_of
from ..errors import CollectiveError, MismatchError, PSError, PSTimeoutError
from ..kvstore import CLOSE_WAIT, KVStore
from . import selfstart
from .names import base_name, described, group_key, label, timeline_bar
from .ops import fingerprint
from .timeline import Timeline

logger = logging.getLogger(__name__)

KeySpec = tuple[str, tuple[int, ...], np.dtype]     # a key's name, the caller's shape, its dtype
CHECKED = 61                # keys checked one by one in a first-use check (the rest by the sum of all)
MEETING = "meeting"         # the key a group's members meet on (first uses of names, barriers)


def verified(checks: Any, pending: Any, job: "Job | None" = None, group: int = 0) -> None:
    """Run ``checks``; if one fails, abandon the calls in ``pending`` (``Handle.abandon``: a
    round the workers disagree on never closes, and nothing should wait for it) and raise,
    a MismatchError once every worker of ``job`` (of its ``group``) raised it (``Job.disagreed``)."""
    try:
        for check in checks:
            check()
    except PSError as exc:
        for handle in pending:
            handle.abandon(exc)
        if isinstance(exc, MismatchError) and job is not None:
            raise job.disagreed(exc, group) from None
        raise


def absent() -> bool:
    """What a Horovod script asks to choose a code path (``hvd.mpi_built()``, ``gloo_enabled``,
    ``cuda_built``, ...): ps moves CPU tensors over its own transport, with none of Horovod's
    MPI, Gloo, NCCL, DDL or oneCCL."""
    return False


def nccl_built() -> int:
    """Horovod returns the NCCL version it was built with, 0 without."""
    return 0


def predivide_factor(value: Any) -> float:
    """Horovod's ``gradient_predivide_factor``, checked: a number above 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {value!r}")
    return float(value)


class Job:
    """This process's place in the job. Without ``DMLC_PS_ROOT_URI`` (and not under a bare
    ``mpirun``/``srun``) it runs alone, size 1, every collective a no-op, as Horovod does
    outside ``horovodrun``, so one script serves both."""

    def __init__(self, api: str, names: str = ""):
        self.api = api                     # "ps.torch": named in the error for a missing init()
        self.names = names                 # what the adapter's tensor keys start with ("hvd.")
        self._store: KVStore | None = None
        self._kept: KVStore | None = None   # the store of a session shut down, for the next init()
        self._alone = False
        self._keys: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self._probes = itertools.count()
        self._checks: set[str] = set()                  # check keys declared so far
        self._excused: set[int] = set()                 # server keys summed without this worker (join)
        self._groups: dict[int, tuple[int, ...]] = {}   # group id -> its ranks (Horovod's process sets)
        self._group_ids = itertools.count(1)            # never reused: a group's keys keep its ranks
        self._timeline: Timeline | None = None
        self._checking: dict[str, str] = {}             # check key -> what its last check was of
        self._suspect: set[str] = set()                 # names seen before a deadlock verdict
        self._waits: Any = None                         # the store's deadlock reporter (ps/waitreport.py)

    def init(self, kvstore: str = "dist_sync") -> None:
        """Join the job (idempotent). After ``shutdown()`` this process joins again through the
        store that session kept: the same cluster, the same rank."""
        if self._store is not None or self._alone:
            return
        if self._kept is not None:
            if self._kept.type != kvstore:
                raise ValueError(f"{self.api}.init(kvstore={kvstore!r}) after shutdown(): this process's job runs "
                                 f"{self._kept.type!r} (the servers keep the mode they started with)")
            self._store, self._kept = self._kept, None
            self._timeline_from_env()
            return
        selfstart.start()           # under mpirun/srun without ps.launch: make the rendezvous here
        if "DMLC_PS_ROOT_URI" not in os.environ:
            self._alone = True
            self._timeline_from_env()
            return
        kv = KVStore(kvstore)
        if kv.restarted:
            # the servers answer a restarted worker's pushes of rounds already closed with the
            # latest sums, which is right for MXNet's kvstore (the weights live on the servers)
            # but would train this worker on from other weights than the rest: refuse
            kv.close()
            raise CollectiveError(
                f"{self.api}: this worker (rank {kv.rank}) was restarted (--max-restarts), but a Horovod-style job "
                "keeps its model and optimizer state on the workers, so a restarted worker cannot rejoin "
                "the step the others are in: the job must start again (a dead server is recovered; a dead "
                "worker is not)")
        self._store = kv
        waits = self._waits = kv.check_deadlocks(self._described)
        if waits is not None:
            waits.listeners.append(self._after_deadlock)
        self._timeline_from_env()

    def _described(self, key: Any) -> str:
        """How a deadlock's MismatchError names what a rank waits for (PS_DEADLOCK_CHECK)."""
        checking = self._checking.get(key)
        if checking is not None:
            return f"the check of its first {checking}"
        if isinstance(key, str) and key.startswith(f"{self.api}.agree."):
            return "an agreement of every worker (add_process_set)"
        if isinstance(key, str) and key.endswith(f"/{MEETING}"):
            return f"a meeting of process set {key.partition('/')[0][len('set'):]} (a barrier, or new tensors)"
        return described(key, self.names)

    def disagreed(self, error: MismatchError, group: int = 0) -> MismatchError:
        """``error``, which a check raises on every worker (of ``group``) alike, to raise once
        each has: meanwhile the servers drop the rounds the disagreement left open (those of the
        group's keys; ps/waitreport.py), which would otherwise mix into later calls of their
        keys. As it is without PS_DEADLOCK_CHECK."""
        waits = self._waits
        if waits is None:
            return error
        return waits.realign(error, self._groups[group] if group in self._groups else None)

    def _after_deadlock(self, _error: Exception) -> None:
        """A deadlock verdict (every worker hears it, I/O thread): every name seen so far is
        checked again at its next use, on every worker alike (a worker that made a key in the
        call that disagreed would otherwise skip the check the others make)."""
        self._suspect = set(self._keys)

    # -- Horovod's timeline -----------------------------------------------------------------
    def _timeline_from_env(self) -> None:
        """``HOROVOD_TIMELINE``: a path rank 0 cannot write is a warning, not an error, since
        the other ranks, which do not write, would go on without it."""
        path = value_of("HOROVOD_TIMELINE")           # alone there is no store, hence no Config
        if path:
            try:
                self.start_timeline(path, value_of("HOROVOD_TIMELINE_MARK_CYCLES"))
            except ValueError as exc:
                logger.warning("HOROVOD_TIMELINE: %s; training goes on without a timeline", exc)

    def start_timeline(self, file_path: str, mark_cycles: bool = False) -> None:
        """Horovod's ``start_timeline``: rank 0 records its collectives in ``file_path`` (one at a
        time: a running timeline is stopped first); the other ranks record nothing, as in
        Horovod, where rank 0 writes the file."""
        if not self.is_initialized():
            raise ValueError(f"{self.api}.init() has not been called")
        path = os.fspath(file_path) if isinstance(file_path, (str, os.PathLike)) else ""
        if not path:
            raise ValueError(f"start_timeline needs a file path, got {file_path!r}")
        self.stop_timeline()
        if self.rank() != 0:
            return
        try:
            self._timeline = Timeline(path, lambda key: timeline_bar(key, self.api, self.names), bool(mark_cycles))
        except OSError as exc:
            raise ValueError(f"start_timeline: cannot write {path!r}: {exc.strerror}") from None
        if self._store is not None:
            self._store.record(self._timeline)

    def stop_timeline(self) -> None:
        """End the timeline's file (plain JSON from then on); nothing if none runs. Bars of
        calls still in flight are not shown."""
        if self._store is not None:
            self._store.record(None)
        if self._timeline is not None:
            self._timeline.close()
            self._timeline = None

    def is_initialized(self) -> bool:
        return self._store is not None or self._alone

    def store(self) -> KVStore | None:
        """The cluster's store, or None when this process runs alone."""
        if not self.is_initialized():
            raise ValueError(f"{self.api}.init() has not been called")
        return self._store

    def rank(self) -> int:
        kv = self.store()
        return 0 if kv is None else kv.rank

    def size(self) -> int:
        kv = self.store()
        return 1 if kv is None else kv.num_workers

    def _hosts(self) -> list[str]:
        kv = self.store()
        return [""] if kv is None else kv.worker_hosts

    def local_rank(self) -> int:
        hosts = self._hosts()
        return hosts[:self.rank()].count(hosts[self.rank()])

    def local_size(self) -> int:
        hosts = self._hosts()
        return hosts.count(hosts[self.rank()])

    def _peers(self) -> list[int]:
        """The ranks with this process's local rank, one per host, in rank order (Horovod's
        cross communicator)."""
        hosts, mine = self._hosts(), self.local_rank()
        return [r for r in range(len(hosts)) if hosts[:r].count(hosts[r]) == mine]

    def cross_rank(self) -> int:
        """Which host this is, counting the hosts that run a worker of this local rank."""
        return self._peers().index(self.rank())

    def cross_size(self) -> int:
        return len(self._peers())

    def is_homogeneous(self) -> bool:
        """Every host runs the same number of workers."""
        hosts = self._hosts()
        return len({hosts.count(h) for h in hosts}) == 1

    # -- groups: collectives over some of the workers ---------------------------------------
    def add_group(self, ranks: Any) -> int:
        """Collective over every worker (in the same order everywhere, as Horovod's
        ``add_process_set``): a group of ``ranks`` whose own keys only its members push.
        Returns its id (1, 2, ...; never reused). Raises ValueError for ranks outside the job
        or a group of these ranks that exists already."""
        try:
            group = tuple(sorted({int(r) for r in ranks}))
        except (TypeError, ValueError):
            raise ValueError(f"a process set is a list of ranks, got {ranks!r:.80}") from None
        size = self.size()
        if not group or any(not 0 <= r < size for r in group):
            raise ValueError(f"process set ranks {list(group)}: not a non-empty list of ranks of this job's "
                             f"{size} workers")
        if group == tuple(range(size)) or group in self._groups.values():
            raise ValueError(f"a process set with ranks {list(group)} exists already")
        gid = next(self._group_ids)
        kv = self._store
        if kv is not None:
            self._agree(f"process set {gid}: ranks {list(group)}",
                        f"the workers disagree on process set {gid} (rank {kv.rank} adds ranks {list(group)}); "
                        "every worker must add the same process sets in the same order")
            if kv.rank in group:
                kv.init(group_key(gid, MEETING), np.zeros(2, np.float64), members=group)
            # the meeting key is on the servers before any member uses it (its init is blocking);
            # operations in flight go on in flight, as at hvd.barrier: waiting for them here
            # would deadlock a worker that has one the others start only after this call
            kv.barrier(wait=False)
        self._groups[gid] = group
        return gid

    def remove_group(self, gid: int) -> None:
        """Collective over every worker. The servers keep the group's keys (small, unused)."""
        if gid not in self._groups:
            raise ValueError(f"process set {gid} is not registered")
        kv = self._store
        if kv is not None:
            kv.barrier()
        del self._groups[gid]

    def group_ranks(self, gid: int) -> tuple[int, ...] | None:
        """A registered group's ranks, or None."""
        return self._groups.get(gid)

    def meet(self, gid: int, text: str, what: str) -> None:
        """Wait until every member of group ``gid`` got here, checking they all say ``text``:
        one pushpull of two numbers on the group's own key. Raises MismatchError (``what``)
        on every member alike if they do not."""
        if self._store is not None:
            self._all_say(group_key(gid, MEETING), text, len(self._groups[gid]), what, gid)

    def _agree(self, text: str, what: str) -> None:
        """Every worker says ``text``, or MismatchError(``what``) on every worker. A collective."""
        probe = f"{self.api}.agree.{next(self._probes)}"
        self._store.declare(probe, (2,), np.float64)
        self._all_say(probe, text, self._store.num_workers, what)

    def _all_say(self, key: str, text: str, count: int, what: str, group: int = 0) -> None:
        """One pushpull of (1, fingerprint of ``text``) on ``key``: the sum is ``count`` x ours
        iff ``count`` workers came and all said ``text``; else MismatchError(``what``), on
        every one of them alike."""
        mine = np.array([1.0, fingerprint(text)], np.float64)
        if not np.array_equal(self._store.pushpull(key, mine), mine * count):
            raise self.disagreed(MismatchError(what), group)

    def ensure_keys(self, items: list[KeySpec], group: int = 0, joinable: bool = False,
                    placement: dict[str, int] | None = None) -> Callable[[], None]:
        """Make the keys not seen yet, and check that every worker asks for the same names,
        shapes and dtypes. Returns ``verify``: call it before using what the keys bring back;
        on a mismatch it raises MismatchError (a ValueError and a RuntimeError) on every
        worker, naming the first differing key.

        Over every worker nobody waits here: the keys are declared (the servers make them at
        their first push) and the check is a sum that travels beside those pushes, so a
        worker may start a new name's collective while another is still at a barrier, as
        in Horovod. ``group``: only that group's members take part; its lowest rank makes
        the keys (with the group's members on the servers), then the members meet, which
        checks them too (``verify`` has nothing left to do). ``joinable``: sums that go on
        without workers in ``join`` (KVStore.declare). ``placement``: the server of some new
        keys over every worker (KVStore.declare's ``server``; the same on every worker)."""
        new = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in items if name not in self._keys]
        again = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in items if name in self._suspect]
        kv = self._store
        verify = _nothing
        if again:
            self._suspect.difference_update(name for name, _, _ in again)
            if not group:
                verify = self.start_check(again + new)
                again = []
        if kv is not None and (new or again) and group:
            if new:
                kv.init([name for name, _, _ in new], [np.zeros(int(np.prod(shape)), dtype) for _, shape, dtype in new],
                        members=self._groups[group])
                # made now, even if the meeting fails: a later call must not make them again
                self._keys.update((name, (shape, dtype)) for name, shape, dtype in new)
            new = again + new
            self.meet(group, repr([(n, s, str(d)) for n, s, d in new]),
                      f"the members of process set {group} ask for different new tensors (rank {kv.rank}: "
                      f"{', '.join(label(n) for n, _, _ in new[:3])}{', ...' if len(new) > 3 else ''}): every "
                      "member must use the same names, shapes and dtypes in the same order")
        elif kv is not None and new:
            for name, shape, dtype in new:
                kv.declare(name, (int(np.prod(shape)),), dtype, joinable=joinable,
                           server=(placement or {}).get(name))
            # keys the other workers made while this one was in join were checked without it
            fresh = [item for item in new if kv.server_key(item[0]) not in self._excused]
            if fresh and verify is _nothing:
                verify = self.start_check(fresh)
        for name, shape, dtype in new:
            self._keys[name] = (shape, dtype)
        return verify

    def check_same_everywhere(self, items: list[KeySpec]) -> None:
        """Wait until every worker asked for ``items``; MismatchError if they differ."""
        self.start_check(items)()

    def start_check(self, items: list[KeySpec]) -> Callable[[], None]:
        """Start summing each key's fingerprint (and the count) over the workers: equal
        everywhere iff the sum is n x our own, n the workers that took part (exact in float64:
        40-bit fingerprints). One pushpull of a fixed size (workers that disagree on the
        count still meet on it), which goes on without workers in ``join``; returns what
        waits for it and raises MismatchError on every worker alike.

        The check's key is named after the first key's name (without its shape): workers
        that disagree on that name wait on two keys instead (the servers' stall warning
        names them), but a worker back from ``join`` finds the checks it missed among the
        rounds it skipped, where a numbered check key would be out of step."""
        kv = self.store()
        if kv is None:
            return _nothing
        probe = f"{self.api}.check.{base_name(items[0][0])}"
        mine = np.zeros(3 + CHECKED, np.float64)
        mine[:3] = 1.0, len(items), fingerprint(repr([(n, s, str(d)) for n, s, d in items]))
        prints = [fingerprint(f"{n}{s}{d}") for n, s, d in items[:CHECKED]]
        self._checking[probe] = described(items[0][0], self.names)
        mine[3:3 + len(prints)] = prints
        if probe not in self._checks:
            kv.declare(probe, mine.shape, mine.dtype, joinable=True)
            self._checks.add(probe)
        total = np.empty_like(mine)
        handle = kv.pushpull(probe, mine, out=total, block=False)

        def verify() -> None:
            handle.wait()
            n = total[0]                # the workers that took part (those in join did not)
            if np.array_equal(total, mine * n):
                return
            raise self.disagreed(MismatchError(_difference(items, total, mine, n, kv.rank)))
        return verify

    def join(self) -> int:
        """Horovod's join (KVStore.join): the last rank to join. Remembers the keys summed
        without this worker, whose first use here is then not checked again."""
        kv = self.store()
        if kv is None:
            return 0
        joined = kv.join()
        self._excused.update(key for key, rounds in joined.skipped.items() if rounds)
        return joined.last

    def shutdown(self) -> None:
        """End this session: its calls in flight are answered, the timeline is closed, the
        groups are gone. The store stays connected until the process exits, for the next
        ``init()``: the scheduler and servers end once every worker has left, so a store
        closed here could not join again, and Horovod lets a process init after shutdown."""
        if self._store is not None:
            _settle(self._store)
        kept = self._store if self._store is not None else self._kept
        self.stop_timeline()                # the store still attached: it stops recording
        self._store, self._kept, self._alone = None, kept, False
        self._groups.clear()
        if kept is None:                    # alone: nothing to keep
            self._keys.clear()
            self._checks.clear()
            self._checking.clear()
            self._suspect.clear()
            self._excused.clear()
            self._group_ids = itertools.count(1)

    def kept(self) -> bool:
        """A session was shut down and its store waits for the next ``init()``."""
        return self._kept is not None


def _settle(kv: KVStore) -> None:
    """Wait until every call in flight is answered, PS_REQUEST_TIMEOUT at most (CLOSE_WAIT
    without one). A call still open then (a round some worker never joined) is named and left
    to finish when it can: closing the store instead would leave the next ``init()`` no job to
    join. A call that failed was reported to its caller; a store that failed says so again at
    the first call of the next session."""
    try:
        kv.wait_all(kv.config.request_timeout or CLOSE_WAIT)
    except PSTimeoutError as exc:
        logger.warning("shutdown: a call is still in flight after %gs and is left to finish later: %s",
                       kv.config.request_timeout or CLOSE_WAIT, exc)
    except PSError:
        pass


def _difference(items: list[KeySpec], total: np.ndarray, mine: np.ndarray, n: float, rank: int) -> str:
    """What a first-use check's sum (``total``, of ``n`` workers) says differs from ``mine``."""
    if total[1] != mine[1] * n:
        return (f"rank {rank} asks for {len(items)} new tensors, but the workers disagree on how many (every worker "
                "must register the same parameters / names in the same order)")
    for (name, shape, dtype), got, own in zip(items, total[3:], mine[3:]):
        if got != own * n:
            return (f"tensor {label(name)} differs across workers: rank {rank} has shape {tuple(shape)} and dtype "
                    f"{dtype}, another worker has a different shape, dtype or order")
    return f"the {len(items)} tensors of rank {rank} differ from another worker's (names, shapes, dtypes or order)"


def _nothing() -> None:
    """``verify`` when there is nothing to check."""
