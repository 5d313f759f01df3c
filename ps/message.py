"""What travels between nodes: a msgpack meta frame followed by raw array frames.

Frame 0 is ``msgpack([VERSION, cmd, sender, recver, request, seq, body])``, with an eighth
element ``flags`` (a bit set of ``Flag``) only when some are set. For
``Command.DATA`` the body is a list of :class:`Entry` records, one per key chunk, each
an array on the wire::

    [ts, op, key, offset, length, total, dtype_code, error, row_len, seq, priority]

``op`` is a bit set of ``Op``; ``offset``/``length``/``total`` count elements of the
server's slice; ``dtype_code`` indexes ``ps.frames.DTYPES``; ``error`` is None or ``[kind, text]``.
Each entry that carries values (push/init requests, pull replies without error) owns the next
array frame: ps/frames.py reads those, and says how row-sparse and embedding-table entries lay
them out.

This module is the envelope and needs no numpy: the scheduler, which never carries arrays,
(and so the launcher it runs in) does not import it, ~0.1 s of CPU and ~26 MB per process;
the first DATA message a node decodes imports ps/frames.py. Nothing here unpickles: a frame that
is not what the meta says is a :class:`ProtocolError`, logged and dropped by the van.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import msgpack

from .errors import ProtocolError
from .pslite import native_node

VERSION = 2
MAX_META_BYTES = 64 << 20      # a meta frame larger than this is refused before decoding
MAX_ENTRIES = 1 << 20


class Role(enum.IntEnum):
    SERVER = 0
    WORKER = 1
    SCHEDULER = 2


class Command(enum.IntEnum):
    DATA = 0          # key/value entries (worker <-> server)
    ADD_NODE = 1      # node -> scheduler: register; scheduler -> node: acknowledged
    NODE_TABLE = 2    # scheduler -> node: ids, ranks and addresses of everyone
    BARRIER = 3       # request -> scheduler; release <- scheduler
    HEARTBEAT = 4
    TERMINATE = 5     # scheduler -> server: the job is over (acknowledged)
    ACK = 6           # transport-level acknowledgement (PS_RESEND)
    CLOSE = 7         # worker -> scheduler: this worker is done (acknowledged)
    WORKER_CLOSED = 8  # scheduler -> servers: a worker closed its store
    NODE_FAILED = 9   # scheduler -> everyone: a node died
    ABORT = 10        # scheduler -> node: the job cannot go on (formation timeout, bad config)
    SERVER_CMD = 11   # worker <-> server: optimizer, learning rate, states... (request/reply)
    STALL = 12        # server/scheduler -> waiting nodes: who a round or barrier still waits for ("over": it went on)
    NODE_DOWN = 13    # scheduler -> everyone (PS_MAX_RESTARTS): a node died; its restart is awaited
    NODE_UP = 14      # scheduler -> everyone: the restarted node is back (its new node table row)
    REJOINED = 15     # restarted node -> scheduler: state recovered, tell the others
    REPLICA = 16      # primary server -> its backup: state changes (request); backup -> primary: ack
    SUBSCRIBE = 17    # backup server -> primary: send me a snapshot, then every change
    FETCH = 18        # restarted server -> its backup: the replica of my state (replies: snapshot parts)
    CREDIT = 19       # server -> worker: I received a message of ``body`` payload bytes (PS_SEND_WINDOW)
    REJOIN = 20       # restarted scheduler -> node: report to me (request); your report is taken (reply)
    BLOCKED = 21      # worker -> scheduler: what it has waited for too long (PS_DEADLOCK_CHECK); back: a deadlock verdict
    DROP_ROUNDS = 22  # scheduler -> servers: drop every open sync round (a deadlock verdict); back: the keys' closed rounds


class Flag:
    """Bits of a message's ``flags``."""

    CREDIT = 1      # a DATA request whose sender counts its bytes in flight: answer with Command.CREDIT
    WINDOWED = 2    # a DATA request from a worker that windows what it sends here: window the replies too


class Op:
    """Bits of a DATA entry's ``op`` (plain ints: enum arithmetic is slow on the hot path)."""

    PUSH = 1
    PULL = 2
    INIT = 4
    TWO_BIT = 8     # push values travel 2-bit packed (ps/compression.py)
    FP16 = 16       # push values travel as float16, the key keeps its dtype
    ROWS = 32       # whole rows: row ids travel with the values (row_sparse push / pull)
    HALF_PULL = 64  # the pulled values travel as float16 (fp16 compression)
    STREAM = 128    # a pushpull across a network: answer each chunk as soon as it is summed (Values._stream)
    CREATE = 256    # a push that makes its key, zeros, if the server has none (KVStore.declare)
    JOINABLE = 512  # a push whose round may close without joined workers, their share zero (KVStore.join)
    TABLE = 1024    # an embedding table's rows by int64 id (``key``: the table's): as ROWS, made on first touch


WIRE_BITS = Op.TWO_BIT | Op.FP16 | Op.HALF_PULL     # how an entry's values travel (ps/compression.py)


class Entry(NamedTuple):
    """One key chunk of a DATA message. A NamedTuple, not a dataclass: msgpack packs it as
    the array the wire carries, with no conversion on the hot path."""

    ts: int              # the request's timestamp on its worker
    op: int              # Op bits
    key: int
    offset: int          # elements into the server's slice of the key
    length: int          # elements in this chunk
    total: int           # elements in the server's slice
    dtype_code: int      # index into ps.frames.DTYPES (the key's dtype, whatever the wire encoding)
    error: Any = None    # None, or [kind, text] in a reply
    row_len: int = 0     # Op.ROWS entries: elements per row
    seq: int = 0         # a push: this worker's 1-based count of pushes to the key (dedupes resends);
                         # a pull: its pushes so far (the round whose value a restarted worker wants)
    priority: int = 0    # a request: MXNet's priority (higher leaves first under PS_SEND_WINDOW)

    def failed(self, kind: str, text: str) -> "Entry":
        """The error reply to this entry: no data, the whole slice answered."""
        return Entry(self.ts, self.op, self.key, 0, 0, self.total, self.dtype_code, [kind, text], self.row_len,
                     self.seq)


def node_name(node_id: int) -> str:
    """ps-lite's short form: H for the scheduler, S[8] for servers, W[9] for workers."""
    if node_id == SCHEDULER:
        return "H"
    if node_id >= 8:
        return f"{'W' if node_id % 2 else 'S'}[{node_id}]"
    return f"?[{node_id}]"


@dataclass
class Node:
    """A row of the node table the scheduler sends every node once the cluster formed."""

    node_id: int
    role: Role
    rank: int
    host: str
    port: int
    addr: str                     # where it listens (tcp://host:port, ipc://...)
    local: list | None = None     # a server's [ipc:// twin, machine id] for peers on its machine

    def to_row(self) -> list[Any]:
        return [self.node_id, int(self.role), self.rank, self.host, self.port, self.addr, self.local]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "Node":
        node_id, role, rank, host, port, addr, *rest = row
        return cls(node_id, Role(role), rank, host, port, addr, rest[0] if rest else None)


SCHEDULER = 1       # the scheduler's node id; ps-lite's numbering, as server_id and worker_id below


def server_id(rank: int) -> int:
    return 8 + 2 * rank


def worker_id(rank: int) -> int:
    return 9 + 2 * rank


def id_to_rank(node_id: int) -> int:
    return max((node_id - 8) // 2, 0)


class Message:
    """One message. ``route`` is the ZeroMQ identity a ROUTER received it from (or
    should send it to); ``frames`` hold the arrays of DATA entries in entry order."""

    __slots__ = ("cmd", "sender", "recver", "request", "seq", "body", "frames", "route", "on_sent", "source",
                 "gen", "flags")

    def __init__(self, cmd: Command, sender: int = 0, recver: int = 0, body: Any = None,
                 frames: Sequence[Any] = (), request: bool = True, route: bytes | None = None,
                 seq: int = 0):
        self.cmd = cmd
        self.sender = sender
        self.recver = recver
        self.request = request
        self.seq = seq
        self.body = body
        self.frames = list(frames)
        self.route = route
        self.on_sent: Callable[[Any], None] | None = None   # gets the zmq MessageTracker
        self.source = 0     # received on a DEALER: the node id that socket is connected to
        self.gen = 0        # the van's generation of its peer when queued (not on the wire)
        self.flags = 0      # Flag bits

    def __repr__(self) -> str:
        kind = "req" if self.request else "reply"
        extra = ""
        if self.cmd == Command.DATA and self.body:
            nbytes = sum(memoryview(f).nbytes for f in self.frames)
            extra = f" entries={len(self.body)} ts={self.body[0].ts} bytes={nbytes}"
        return (f"{node_name(self.sender)} => {node_name(self.recver)} "
                f"{Command(self.cmd).name} {kind}{extra}")


def namespace_field(namespace: int) -> dict[str, int]:
    """A server command's namespace field (ps/server/updaters.py's per-store optimizers): none for
    namespace 0, which is what a command without one means."""
    if not isinstance(namespace, int) or isinstance(namespace, bool) or namespace < 0:
        raise ValueError(f"namespace must be an int >= 0, got {namespace!r}")
    return {"ns": namespace} if namespace else {}


def namespace_of(body: dict[str, Any]) -> int:
    """The namespace a received server command is for: 0 unless it names one."""
    ns = body.get("ns", 0)
    if not isinstance(ns, int) or isinstance(ns, bool) or ns < 0:
        raise ValueError(f"bad namespace {ns!r} in a server command")
    return ns


def entry_has_data(request: bool, op: int, error: Any) -> bool:
    """Whether the entry owns a data item (an array, or Rows for a row-sparse request)."""
    if request:
        return bool(op & (Op.PUSH | Op.INIT | Op.ROWS | Op.TABLE))
    return bool(op & Op.PULL) and error is None


def encode(msg: Message) -> list[Any]:
    fields = [VERSION, int(msg.cmd), msg.sender, msg.recver, msg.request, msg.seq, msg.body]
    if msg.flags:
        fields.append(msg.flags)
    meta = msgpack.packb(fields, use_bin_type=True)
    return [meta, *msg.frames]


_COMMANDS = {int(c): c for c in Command}


def frame_buffer(frame: Any) -> memoryview:
    """A received frame's bytes, without a copy (a zmq.Frame, or a stream's memoryview)."""
    buf = getattr(frame, "buffer", None)    # zmq.Frame
    return buf if buf is not None else memoryview(frame)


def decode(frames: Sequence[Any], route: bytes | None = None) -> Message:
    """Parse received frames; raise ProtocolError for anything malformed."""
    if not frames:
        raise ProtocolError("empty message")
    head = frame_buffer(frames[0])
    if head.nbytes > MAX_META_BYTES:
        raise ProtocolError(f"meta frame of {head.nbytes} bytes exceeds {MAX_META_BYTES}")
    try:
        meta = msgpack.unpackb(head, raw=False, strict_map_key=False, max_bin_len=MAX_META_BYTES, max_str_len=MAX_META_BYTES,
                               max_array_len=MAX_ENTRIES, max_map_len=MAX_ENTRIES)
        version, cmd, sender, recver, request, seq, body, *extra = meta
        cmd = _COMMANDS.get(cmd, cmd)       # a dict, not Command(cmd): an enum call is 10x slower
        if not isinstance(cmd, Command):
            raise ValueError(f"{cmd!r} is not a command")
    except ProtocolError:
        raise
    except Exception as exc:
        native = native_node(head.tobytes())
        if native is not None:
            raise native from None
        raise ProtocolError(f"undecodable meta: {exc}") from None
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {VERSION}")
    if not (isinstance(sender, int) and isinstance(recver, int) and isinstance(seq, int)):
        raise ProtocolError("sender, recver and seq must be integers")
    if len(extra) > 1 or (extra and not isinstance(extra[0], int)):
        raise ProtocolError(f"unexpected meta fields {extra!r:.100}")
    msg = Message(cmd, sender, recver, body, request=bool(request), route=route, seq=seq)
    if extra:
        msg.flags = extra[0]
    if cmd == Command.DATA:
        msg.frames = _data_arrays(body, frames[1:], bool(request))
    elif cmd in (Command.REPLICA, Command.FETCH):     # checked against their events by ps/server/replica.py
        msg.frames = [frame_buffer(f) for f in frames[1:]]
    elif len(frames) > 1:
        raise ProtocolError(f"{cmd.name} carries {len(frames) - 1} unexpected data frames")
    return msg


def _data_arrays(entries: Any, frames: Sequence[Any], request: bool) -> list[Any]:
    """The first DATA message: import ps/frames.py (and numpy) and read its arrays there,
    as every later one does straight away."""
    global _data_arrays
    from .frames import data_arrays
    _data_arrays = data_arrays
    return data_arrays(entries, frames, request)
