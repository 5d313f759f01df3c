"""The server role: decode requests, let the Store decide, hand what it returns to the outbox.

Handlers run on the van's I/O thread, so replies leave without a thread hop. The outbox is
the reply sender itself (ps/server/replies.py), or, when a backup keeps this server's
replica, the replication that holds replies until the backup has what they depend on
(ps/server/replication.py). Values go out zero-copy under the copy-on-write rule of
ps/server/bufguard.py.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .. import compression, optim
from .._timing import PauseWatch
from ..config import Config
from ..errors import PSError
from ..message import SCHEDULER, Command, Message, Op, entry_has_data, id_to_rank, namespace_of, node_name, worker_id
from ..nodestats import stall_list
from ..postoffice import Postoffice
from ..van import Van
from . import imports
from .bufguard import BufferGuard
from .events import Event
from .profiler import ServerProfiler
from .replication import Replication
from .replies import Outbox, ReplySender
from .rounds import Reply, Stall
from .store import Store
from .tables import Tables
from .updaters import Updater

logger = logging.getLogger(__name__)
STALL_CHECK = 0.5       # s between two stall checks (PS_STALL_WARNING)


class KVServer:
    """``KVServer(config).run()`` serves until the job ends; returns the exit code."""

    def __init__(self, config: Config, van: Van | None = None):
        self.po = Postoffice(config, van)
        self.guard = BufferGuard()
        # made now, not on first use: a backup may subscribe as soon as the barrier of
        # start() lets the other servers go; the node table then tells its mode and this
        # server's name (start), before any request is served (_early_or)
        self.store = Store(self.po.num_workers, guard=self.guard, chunk_bytes=config.chunk_bytes,
                           keep_before=config.max_restarts > 0)
        self.error: PSError | None = None
        self._stopped = threading.Event()
        self._joined = threading.Event()
        self._stalls: dict[tuple[int, int], Stall] = {}   # (key, round) -> as last warned
        self._stall_opened: dict[tuple[int, int], float] = {}   # (key, round) -> when its first push came
        # server commands wait while a slow module their optimizer needs is imported (imports.py)
        self.slow_imports = imports.SlowImports(self.po.call_soon, self._on_command, config.allow_pickle,
                                                name=lambda: self.name)
        self.po.stats.add(self._report)
        self._checks = PauseWatch(STALL_CHECK)    # the stall checks as the I/O thread runs them (run())
        # requests that came before this server could answer them (I/O thread): a restart's,
        # before its state is back from the replica; any server's, before it has its node table
        self._serving = False
        self._early: list[Message] = []
        self.profiler: ServerProfiler | None = None     # made by the first "profiler" command
        self.sender = ReplySender(self.po, self.guard)
        self.tables = Tables(self.po.num_workers, journal=lambda: self.store.journal,
                             joined=lambda: self.store.joins.joined)
        self.po.on(Command.DATA, self._on_data)
        self.po.on(Command.SERVER_CMD, self._on_command)
        self.po.on(Command.WORKER_CLOSED, self._on_worker_closed)
        self.po.on(Command.DROP_ROUNDS, self._on_drop_rounds)
        self.po.on(Command.TERMINATE, self._on_terminate)
        self.po.add_failure_listener(self._on_failure)
        self.replication = Replication(self.po, lambda: self.name, self.store, self.tables, self.sender)
        # where replies go: straight to the sender, or held for the backup (PS_MAX_RESTARTS)
        self.outbox: Outbox = self.replication if self.replication.enabled else self.sender
        self.po.add_node_listener(self._on_node)

    def start(self) -> None:
        self.po.start()
        self.store.sync, self.store.name = self.po.sync, self.name
        self.tables.name = self.name
        error = self.replication.start()
        if self.po.restarted:
            if error is not None:
                self.po.rejoined(error)
                raise PSError(f"{self.name} cannot recover: {error}")
            imports.load_for(self.store.opts.updaters.values())
            self.po.call_soon(self._serve)      # before REJOINED: what its NODE_UP makes workers resend
            self.po.rejoined(None)
        else:
            self.po.call_soon(self._serve)
        self._joined.set()

    def _early_or(self, msg: Message) -> bool:
        """Hold ``msg`` until start() has run (``_serve``). A restart's empty store would tell a
        restarted worker asking how far it got "nowhere", and apply its replayed
        set_optimizer over the recovered optimizer state."""
        if self._serving:
            return False
        self._early.append(msg)
        return True

    def _serve(self) -> None:
        """The state is here (I/O thread). A worker that died before this restart registered
        (its machine's worker, usually) is told of only in the node table, never by a NODE_DOWN:
        its restart replays its script, so mark it as the live NODE_DOWN would have."""
        try:
            if self.po.restarted:
                for node_id in list(self.po.down):
                    self._on_node(node_id, False)
        finally:            # an error above must not leave every request held
            self._serving = True
        early, self._early = self._early, []
        for msg in early:
            try:
                (self._on_data if msg.cmd == Command.DATA else self._on_command)(msg)
            except Exception:   # noqa: BLE001 - as the I/O thread would: log it, go on with the rest
                logger.exception("%s: handling %r failed", self.name, msg)

    def run(self) -> int:
        try:
            if not self._joined.is_set():
                self.start()
            pause = PauseWatch(STALL_CHECK, lambda: self.name)
            self._checks = PauseWatch(STALL_CHECK)
            while not self._stopped.wait(STALL_CHECK):
                if self.po.config.stall_warning and not pause.hold():
                    self.po.call_later(self._check_stalls)     # the store lives on the I/O thread
        except PSError as exc:
            self.error = exc
        finally:
            self.po.close(linger=1.0)
            if self.profiler is not None:
                self.profiler.close()
        if self.error is not None:
            logger.error("%s exits: %s", self.po, self.error)
            return 1
        return 0

    def stop(self) -> None:
        self._stopped.set()

    @property
    def name(self) -> str:
        return f"server {self.po.rank} ({node_name(self.po.node_id)})" if self.po.node_id else "server"

    def _recording(self) -> ServerProfiler | None:
        """The profiler while it records (mx.profiler's server calls), else None."""
        return self.profiler if self.profiler is not None and self.profiler.running else None

    # -- data ----------------------------------------------------------------------------
    def _on_data(self, msg: Message) -> None:
        if not msg.request or self._early_or(msg):
            return
        self.po.credit(msg)
        self.sender.came(msg)
        store = self.store
        replies: list[Reply] = []
        arrays = iter(msg.frames)
        profiler = self._recording()
        for entry in msg.body:
            data = next(arrays) if entry_has_data(True, entry.op, None) else None
            if profiler is not None:
                start, due = time.perf_counter(), len(replies)
            try:
                replies += (self.tables if entry.op & Op.TABLE else store).handle(msg.sender, entry, data)
            except Exception as exc:  # noqa: BLE001 - a bug or a failing optimizer: answer, never hang
                logger.exception("%s: %r failed", self.name, entry)
                replies.append(Reply(msg.sender, entry.failed(type(exc).__name__, f"{self.name}: {exc}"), None))
            if profiler is not None:
                profiler.record(_op_name(entry.op), "request", start,
                                {"key": entry.key, "worker": id_to_rank(msg.sender), "offset": entry.offset,
                                 "elements": entry.length, "of": entry.total,
                                 "replies": len(replies) - due})    # > 0: it closed a round (and updated)
        self.outbox.send(replies)
        if self._stalls:
            self._report_resumed()
        if self.tables.warned:
            self._tables_resumed()

    # -- stall warnings -------------------------------------------------------------------
    def _check_stalls(self) -> None:
        """Warn once per stalled round (PS_STALL_WARNING), naming the keys and the workers it
        waits for, here and to the workers that wait on it; say when it moves on.

        A check the I/O thread runs over a second late is skipped (``_checks``, silently:
        run() names a pause of the process): the process was stopped while it was queued,
        or the thread is still reading what came, and the pushes a round lacks may be among it."""
        if self._checks.hold():
            return
        after = self.po.config.stall_warning
        self._warn_tables(after)
        self._report_resumed()
        found = self.store.stalls(after, self.po.worker_ids)
        new = [s for s in found if (s.key, s.round) not in self._stalls and s.missing]
        self._stalls.update(((s.key, s.round), s) for s in new)
        now = time.monotonic()
        self._stall_opened.update(((s.key, s.round), now - s.waited) for s in new)
        self.po.stalled.set(bool(self._stalls))
        groups: dict[tuple[int, tuple[int, ...]], list[Stall]] = {}
        for stall in new:
            groups.setdefault((stall.round, stall.missing), []).append(stall)
        for (rnd, missing), stalls in groups.items():
            waiting = sorted({w for s in stalls for w in s.waiting})
            text = (f"{self.name}: sync round {rnd} of {_keys(stalls)} has waited {max(s.waited for s in stalls):.0f}s "
                    f"for {', '.join(self._describe(w) for w in missing)}{_waiting(waiting)} "
                    f"(PS_STALL_WARNING={after:g}s; is that worker stuck in its data loader or a debugger?)")
            self._announce(text, waiting)

    def _announce(self, text: str, workers: Any, over: bool = False) -> None:
        """Log a stall (``over``: that it went on) and tell the workers that wait on it."""
        logger.warning("%s", text)
        body = {"text": text, "over": True} if over else {"text": text}
        for worker in workers:
            self.po.send(Message(Command.STALL, recver=worker, body=body, request=False,
                                 route=self.sender.routes.get(worker)))

    def _warn_tables(self, after: float) -> None:
        """Name embedding tables' stalled sync rounds as _check_stalls names keys'."""
        self._tables_resumed()
        for stall in self.tables.stalls(after):
            text = (f"{self.name}: {stall.what} {stall.round} of embedding table {stall.table!r} has waited "
                    f"{stall.waited:.0f}s for {', '.join(self._describe(w) for w in stall.missing)}"
                    f"{_waiting(list(stall.waiting))} (PS_STALL_WARNING={after:g}s)")
            self._announce(text, stall.waiting)

    def _tables_resumed(self) -> None:
        """Say when a table's round we warned about closed."""
        for stall in self.tables.resumed():
            self._announce(f"{self.name}: the stalled {stall.what} {stall.round} of embedding table "
                           f"{stall.table!r} went on", stall.waiting, over=True)

    def _report_resumed(self) -> None:
        """Say when a round we warned about closes (its key counted one more round)."""
        keys = self.store.keys
        over = [s for s in self._stalls.values() if s.key not in keys or keys[s.key].closed >= s.round]
        if not over:
            return
        for s in over:
            del self._stalls[(s.key, s.round)]
            self._stall_opened.pop((s.key, s.round), None)
        self.po.stalled.set(bool(self._stalls))
        text = f"{self.name}: the stalled sync round {max(s.round for s in over)} of {_keys(over)} went on"
        still = {w for s in self._stalls.values() for w in s.waiting}    # named by a round still stalled
        self._announce(text, sorted({w for s in over for w in s.waiting} - still), over=True)

    def _report(self) -> dict[str, Any]:
        """Its part of the heartbeat's report (heartbeat thread): rounds closed, and the
        stalls it warned about that are not over, grouped as its warnings group them."""
        now = time.monotonic()
        groups: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}
        for (key, rnd), stall in list(self._stalls.items()):
            group = groups.setdefault((rnd, stall.missing), {
                "round": rnd, "keys": [], "missing": [id_to_rank(w) for w in stall.missing],
                "waiting": sorted({id_to_rank(w) for w in stall.waiting}), "seconds": 0.0})
            group["keys"].append(key)
            group["seconds"] = max(group["seconds"], now - self._stall_opened.get((key, rnd), now))
        return {"rounds_closed": self.store.rounds_closed, "stalls": stall_list(list(groups.values()))}

    def _describe(self, worker: int) -> str:
        node = self.po.nodes.get(worker)
        where = f" on {node.host}" if node is not None else ""
        return f"worker {id_to_rank(worker)} ({node_name(worker)}{where})"

    # -- commands ------------------------------------------------------------------------
    def _on_command(self, msg: Message) -> None:
        if self._early_or(msg) or self.slow_imports.hold(msg):
            return
        body = msg.body if isinstance(msg.body, dict) else {}
        reply: dict[str, Any] = {"id": body.get("id")}
        cmd = body.get("cmd")
        setting = cmd in _SETTINGS
        try:
            handler = self._COMMANDS.get(cmd)
            if handler is None:
                raise ValueError(f"unknown server command {cmd!r}")
            store = self.store
            cid = body.get("id")
            if setting and namespace_of(body):    # a second kvstore's settings are counted apart
                cmd = f"{cmd}@{namespace_of(body)}"
            if setting and store.setting_resent(msg.sender, cid):
                logger.info("%s: %s from %s sent again (its answer died with this server's dead self): "
                            "not applied twice", self.name, cmd, node_name(msg.sender))
            elif setting and store.setting_made_before(msg.sender, cmd, cid):
                # a restarted worker re-running its script: its dead self set this already
                logger.info("%s: %s from restarted %s ignored (it replays)", self.name, cmd, node_name(msg.sender))
            else:
                profiler = self._recording()
                start = time.perf_counter() if profiler is not None else 0.0
                reply["result"] = handler(self, store, body)
                if profiler is not None and cmd != "profiler":
                    profiler.record(f"command {cmd}", "command", start, {"worker": id_to_rank(msg.sender)})
                if setting:
                    store.setting_applied(msg.sender, cmd, cid)
        except Exception as exc:  # noqa: BLE001 - reported to the worker, server goes on
            reply["error"] = [type(exc).__name__, f"{self.name}: {exc}"]
        self.outbox.send_message(Message(Command.SERVER_CMD, recver=msg.sender, body=reply, request=False,
                                         route=msg.route))

    def _set_optimizer(self, store: Store, body: dict[str, Any]) -> None:
        opt, ns = optim.from_spec(body["spec"]), namespace_of(body)
        store.set_updater(optim.Updater(opt), opt.multi_precision, ns)
        store.record(Event("opt", ns, 0, [opt.to_spec(), opt.multi_precision]))

    def _set_optimizer_pickle(self, store: Store, body: dict[str, Any]) -> None:
        from .. import _security
        from ..optim import pickled
        cfg = self.po.config
        if not cfg.allow_pickle:
            raise PermissionError("this server refuses pickled optimizers (PS_ALLOW_PICKLE=0)")
        key = _security.signing_key(cfg.secret_file, cfg.job_key_file)
        if key is None:
            raise PermissionError(f"this job has no signing key, so its servers unpickle nothing: {_security.NO_KEY}")
        opt = pickled.load_optimizer(body["payload"], body["signature"], key)
        store.set_updater(pickled.MXNetUpdater(opt), bool(opt.multi_precision), namespace_of(body))
        store.record(Event("unreplicable", 0, 0, f"a pickled MXNet optimizer ({type(opt).__name__}) "
                                                        "cannot be replicated; use one ps has in numpy"))

    def _set_params(self, store: Store, body: dict[str, Any]) -> None:
        opt = self._updater(store, body).optimizer
        if "learning_rate" in body:
            opt.set_learning_rate(float(body["learning_rate"]))   # ps's and MXNet's optimizers alike
        if "rescale_grad" in body:
            opt.rescale_grad = float(body["rescale_grad"])
        changed = {k: float(body[k]) for k in ("learning_rate", "rescale_grad") if k in body}
        store.record(Event("params", namespace_of(body), 0, changed))

    def _get_states(self, store: Store, body: dict[str, Any]) -> bytes:
        return self._updater(store, body).get_states()

    def _set_states(self, store: Store, body: dict[str, Any]) -> None:
        self._updater(store, body).set_states(body["states"])
        store.record(Event("states", namespace_of(body), 0, body["states"]))

    def _set_namespace(self, store: Store, body: dict[str, Any]) -> None:
        store.set_namespace([int(k) for k in body["keys"]], namespace_of(body))

    def _set_members(self, store: Store, body: dict[str, Any]) -> None:
        store.set_members([int(k) for k in body["keys"]], [worker_id(int(r)) for r in body["ranks"]])

    def _join(self, store: Store, body: dict[str, Any]) -> None:
        replies = store.join(worker_id(int(body["rank"]))) + self.tables.worker_joined()
        if replies:
            self.outbox.send(replies)

    def _leave(self, store: Store, body: dict[str, Any]) -> dict[str, Any]:
        worker = worker_id(int(body["rank"]))
        last, skipped = store.leave(worker)
        replies = self.tables.worker_left(worker)
        if replies:
            self.outbox.send(replies)
        return {"last": id_to_rank(last), "skipped": skipped, "tables": self.tables.progress()}

    def _set_compression(self, store: Store, body: dict[str, Any]) -> None:
        store.compression = compression.parse(body["params"])
        store.record(Event("compression", 0, 0, store.compression))

    def _stats(self, store: Store, body: dict[str, Any]) -> dict[str, Any]:
        stats = store.stats()
        if self.tables.tables:
            stats["tables"] = self.tables.stats()
        return stats

    def _pushed(self, store: Store, body: dict[str, Any]) -> dict[int, int]:
        worker = int(body["worker"])
        return {**store.pushed(worker), **self.tables.pushed(worker)}

    def _profile(self, store: Store, body: dict[str, Any]) -> dict[str, Any]:
        if self.profiler is None:
            self.profiler = self.sender.profiler = ServerProfiler(self.po.rank, self.name)
        return self.profiler.command(body)

    def _table(self, store: Store, body: dict[str, Any]) -> dict[str, int]:
        return self.tables.declare(body)

    def _table_export(self, store: Store, body: dict[str, Any]) -> dict[str, Any]:
        return self.tables.export(body)

    def _table_saved(self, store: Store, body: dict[str, Any]) -> None:
        self.tables.saved(body)

    def _table_put(self, store: Store, body: dict[str, Any]) -> int:
        return self.tables.put(body)

    _COMMANDS: dict[str, Callable[[KVServer, Store, dict[str, Any]], Any]] = {
        "table": _table,
        "table_export": _table_export,
        "table_saved": _table_saved,
        "table_put": _table_put,
        "set_optimizer": _set_optimizer,
        "set_optimizer_pickle": _set_optimizer_pickle,
        "set_params": _set_params,
        "get_states": _get_states,
        "set_states": _set_states,
        "set_compression": _set_compression,
        "set_namespace": _set_namespace,
        "set_members": _set_members,
        "join": _join,
        "leave": _leave,
        "stats": _stats,
        "pushed": _pushed,
        "profiler": _profile,
    }

    @staticmethod
    def _updater(store: Store, body: dict[str, Any]) -> Updater:
        ns = namespace_of(body)
        updater = store.opts.updaters.get(ns)
        if updater is None:
            raise RuntimeError("no optimizer is set on the servers (kv.set_optimizer)"
                               + (f" for namespace {ns} (this process's kvstore number {ns + 1})" if ns else ""))
        return updater

    # -- lifecycle messages ---------------------------------------------------------------
    def _on_worker_closed(self, msg: Message) -> None:
        self.outbox.send(self.store.worker_closed(msg.body["id"]) + self.tables.worker_closed(msg.body["id"]))

    def _on_drop_rounds(self, msg: Message) -> None:
        """The scheduler found the workers deadlocked (ps/waits.py): drop the rounds they left
        open, then say which keys had one, before any worker hears the verdict and pushes again."""
        ranks = msg.body.get("members")
        closed = self.store.drop_open(None if ranks is None else frozenset(worker_id(int(r)) for r in ranks))
        if closed:
            logger.warning("%s: dropped the open rounds of %d keys (the workers' waits were deadlocked)",
                           self.name, len(closed))
        self.po.send(Message(Command.DROP_ROUNDS, recver=SCHEDULER, request=False, route=msg.route,
                             body={"verdict": msg.body.get("verdict"), "closed": [[k, n] for k, n in closed.items()]}))

    def _on_terminate(self, msg: Message) -> None:
        self.po.send(Message(Command.TERMINATE, recver=SCHEDULER, request=False, route=msg.route))
        self._stopped.set()

    def _on_node(self, node_id: int, up: bool) -> None:
        """A worker died and its restart is awaited (I/O thread, like the store)."""
        if up or node_id not in self.po.worker_ids:
            return
        self.sender.forget(node_id)
        self.store.worker_died(node_id)
        self.replication.flush()    # the replica learns of it now, not with the next request

    def _on_failure(self, exc: PSError) -> None:
        self.error = exc
        self._stopped.set()



# the commands a restarted worker's script sends again that must not be applied again: its
# n-th of each is ignored if its dead self made n or more (Restarts.setting_made_before). A
# table_put is a checkpoint's rows: applied again, it would put them over the rows trained since
_SETTINGS = ("set_optimizer", "set_optimizer_pickle", "set_params", "set_states", "set_compression", "table_put")


def _op_name(op: int) -> str:
    """A profile's name for a request entry."""
    if op & Op.INIT:
        return "init"
    kind = "pushpull" if op & Op.PUSH and op & Op.PULL else "push" if op & Op.PUSH else "pull"
    return f"{kind} rows" if op & Op.ROWS else kind


def _keys(stalls: list[Stall]) -> str:
    keys = sorted(s.key for s in stalls)
    shown = ", ".join(map(str, keys[:8])) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return f"key{'s' if len(keys) > 1 else ''} {shown}"


def _waiting(workers: list[int]) -> str:
    if not workers:
        return ""
    ranks = ", ".join(str(id_to_rank(w)) for w in workers)
    return f"; worker{'s' if len(workers) > 1 else ''} {ranks} pushed and wait{'' if len(workers) > 1 else 's'}"
