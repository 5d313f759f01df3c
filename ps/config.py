"""Every environment variable ps reads, parsed once into a frozen :class:`Config`.

Nothing else in ps reads ``os.environ``: roles, tests and the launcher build a
``Config`` (``Config.from_env(mapping)``) and pass it down explicitly, so one test
process can host a whole cluster with different settings per node.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from .errors import ConfigError
from .keys import CHUNK_BYTES

ROLES = ("scheduler", "server", "worker", "joint")
SCRIPT_ROLES = ("worker", "joint")   # roles that run the training script (joint: a worker holding a server shard)


def _int(name: str, raw: str, lo: int | None = 0, hi: int | None = None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if lo is not None and value < lo:
        raise ConfigError(f"{name} must be >= {lo}, got {raw!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"{name} must be <= {hi}, got {raw!r}")
    return value


def _float(name: str, raw: str, lo: float = 0.0) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value != value or value < lo:
        raise ConfigError(f"{name} must be a number >= {lo}, got {raw!r}")
    return value


def _bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")


def _bytes(name: str, raw: str) -> int:
    """A byte count: 4194304, 4096K, 4M or 1G (powers of 1024)."""
    text = raw.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{name} must be a byte count such as 4194304, 4M or 512K, got {raw!r}") from None
    if value != value or value < 0:
        raise ConfigError(f"{name} must be >= 0, got {raw!r}")
    return int(value * scale)


CHUNK_MIN = 96 << 10      # PS_CHUNK_BYTES' least: above the 64K up to which PS_SEND_WINDOW counts no message


def whole_words(nbytes: int) -> int:
    """``nbytes`` rounded down to a multiple of 8 (the widest dtype): a key is cut into whole
    elements, and a message leaves once it holds a full chunk."""
    return nbytes - nbytes % 8


def _chunk_bytes(name: str, raw: str) -> int:
    """A byte count of at least CHUNK_MIN, rounded down to whole 8-byte words (:func:`whole_words`)."""
    value = _bytes(name, raw)
    if value < CHUNK_MIN:
        raise ConfigError(f"{name} must be at least {CHUNK_MIN >> 10}K ({CHUNK_MIN}), got {raw!r}: smaller messages would cost "
                          "more than they carry, and PS_SEND_WINDOW does not count those of 64K or less")
    return whole_words(value)


def _auto_bool(name: str, raw: str) -> str:
    """``auto``, or a bool written as ``1``/``0``: what a feature ps decides by itself unless told."""
    if raw.strip().lower() == "auto":
        return "auto"
    try:
        return "1" if _bool(name, raw) else "0"
    except ConfigError:
        raise ConfigError(f"{name} must be auto, 1 or 0, got {raw!r}") from None


def _role(name: str, raw: str) -> str:
    if raw not in ROLES:
        raise ConfigError(f"{name} must be one of {', '.join(ROLES)}, got {raw!r}")
    return raw


def _port_range(name: str, raw: str) -> tuple[int, int] | None:
    if not raw.strip():
        return None
    lo, sep, hi = raw.partition("-")
    if not sep:
        raise ConfigError(f"{name} must look like 'LOW-HIGH' (e.g. 9000-9100), got {raw!r}")
    a, b = _int(name, lo, 1, 65535), _int(name, hi, 1, 65535)
    if a > b:
        raise ConfigError(f"{name}: LOW must not exceed HIGH, got {raw!r}")
    return (a, b)


def _str(name: str, raw: str) -> str | None:
    return raw.strip() or None


class Listen(NamedTuple):
    host: str
    port: int       # 0: any free port


def _listen(name: str, raw: str) -> Listen | None:
    """``[HOST:]PORT`` to listen on; the host defaults to 127.0.0.1 (this machine only)."""
    text = raw.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if sep and not host:
        raise ConfigError(f"{name} must be [HOST:]PORT (e.g. 8787 or 0.0.0.0:8787), got {raw!r}")
    try:
        number = _int(name, port, 0, 65535)
    except ConfigError:
        raise ConfigError(f"{name} must be [HOST:]PORT with a port from 0 to 65535 (e.g. 8787 or "
                          f"0.0.0.0:8787), got {raw!r}") from None
    return Listen(host.strip("[]") or "127.0.0.1", number)


@dataclass(frozen=True)
class Var:
    """One environment variable: where it lands in Config and how it is parsed."""

    name: str
    field: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    required: bool = False


# glibc's own malloc variables: set, they win over PS_SERVER_MALLOC_KEEP
MALLOC_OWN = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

VARIABLES: tuple[Var, ...] = (
    Var("DMLC_ROLE", "role", _role, "worker", "scheduler, server, worker, or joint (a worker that holds a server shard)"),
    Var("DMLC_PS_ROOT_URI", "root_uri", _str, None, "scheduler IP or host name (resolved to an IP)", True),
    Var("DMLC_PS_ROOT_PORT", "root_port", lambda n, r: _int(n, r, 0, 65535), None,
        "scheduler port (0 only for a scheduler started by the launcher: pick a free one)", True),
    Var("DMLC_NUM_SERVER", "num_servers", lambda n, r: _int(n, r, 1), None, "number of servers", True),
    Var("DMLC_NUM_WORKER", "num_workers", lambda n, r: _int(n, r, 1), None, "number of workers", True),
    Var("DMLC_INTERFACE", "interface", _str, None,
        "network interface whose IPv4 address this node announces"),
    Var("DMLC_NODE_HOST", "node_host", _str, None,
        "announce (and bind) this address instead; wins over DMLC_INTERFACE"),
    Var("DMLC_LOCAL", "local", _bool, False, "1: every node on one host, use ipc:// sockets"),
    Var("DMLC_USE_KUBERNETES", "use_kubernetes", _bool, False,
        "1: the scheduler binds every interface, since DMLC_PS_ROOT_URI names a Service, not the pod "
        "(as ps-lite; python -m ps.launch --launcher kubernetes sets it)"),
    Var("DMLC_RANK", "rank_hint", lambda n, r: _int(n, r, 0) if r.strip() else None, None,
        "ask for this rank within the node's role (the launcher sets it); otherwise ranks follow "
        "host (descending) then port (ascending), as ps-lite"),
    Var("PORT", "port", lambda n, r: _int(n, r, 0, 65535), 0, "this node's own port; 0 = any free port"),
    Var("DMLC_PORT", "port", lambda n, r: _int(n, r, 0, 65535), 0, "same as PORT (PORT wins)"),
    Var("PS_PORT_RANGE", "port_range", _port_range, None,
        "LOW-HIGH: pick this node's port from that range (firewalls)"),
    Var("PS_VERBOSE", "verbose", lambda n, r: _int(n, r, 0, 2), 0,
        "1: lifecycle at INFO, 2: every message at DEBUG"),
    Var("PS_RESEND", "resend", _bool, False,
        "1: acknowledge every message, resend unacknowledged ones, drop duplicates"),
    Var("PS_RESEND_TIMEOUT", "resend_timeout", lambda n, r: _int(n, r, 1), 1000,
        "milliseconds before an unacknowledged message is first resent"),
    Var("PS_DROP_MSG", "drop_msg", lambda n, r: _float(n, r), 0.0,
        "percent of received messages dropped at random once the cluster formed (testing)"),
    Var("PS_HEARTBEAT_INTERVAL", "heartbeat_interval", _float, 1.0,
        "seconds between heartbeats to the scheduler; 0 = off (a closed connection to the scheduler still ends the node)"),
    Var("PS_HEARTBEAT_TIMEOUT", "heartbeat_timeout", _float, 30.0,
        "seconds of silence after which a node is declared dead; 0 = never"),
    Var("PS_CONNECT_TIMEOUT", "connect_timeout", _float, 120.0,
        "seconds the cluster may take to form (a scheduler name that does not resolve yet is retried "
        "meanwhile), and that nodes wait for a dead scheduler's restart under PS_MAX_RESTARTS"),
    Var("PS_REQUEST_TIMEOUT", "request_timeout", _float, 0.0,
        "seconds one push/pull/barrier may take; 0 = no bound (a dead peer is reported anyway); a pause "
        "of the waiting process itself (SIGSTOP, a debugger, swap) that left its wait more than a second "
        "late is not counted"),
    Var("PS_STALL_WARNING", "stall_warning", _float, 60.0,
        "seconds a sync round or barrier may wait for some workers before the server (or the scheduler) "
        "and the waiting workers log which ranks, hosts and keys it waits for; a worker whose request "
        "nobody has named after twice this long names it and the server it waits on; 0 = off"),
    Var("PS_DEADLOCK_CHECK", "deadlock_check", _float, 1.0,
        "seconds a worker of a Horovod-style job (ps.torch, ps.mxnet's Horovod API) waits on a collective"
        " before it tells the scheduler what it waits for; when every worker waits for a round another "
        "will never push (the ranks disagree on shapes, names, operations, process sets or order), the "
        "servers drop the open rounds and every worker raises MismatchError naming the waits, about two "
        "periods after the last worker blocked, and the job goes on; 0 = never ask"),
    Var("PS_MAX_RESTARTS", "max_restarts", lambda n, r: _int(n, r, 0), 0,
        "restarts of dead servers and workers the job allows (python -m ps.launch --max-restarts N sets "
        "it for every process); > 0: instead of ending the job, everyone waits up to PS_CONNECT_TIMEOUT "
        "for a dead node to come back, each server keeps a replica of another's state, and workers keep "
        "each push until it is answered; a scheduler started again at its address rebuilds the job from "
        "the live nodes"),
    Var("PS_SEND_WINDOW", "send_window", _bytes, 8 << 20,
        "bytes a worker (a server) may have on the way to the servers (workers) across a network (16M, "
        "512K...): requests and replies beyond it wait and leave highest priority first (MXNet's "
        "priority=-index: the first layer's gradient overtakes the backlog of later layers'); peers on "
        "the same machine (ipc://) are not held back; a message of at most 64 KiB is not counted (nor "
        "credited); 0 = off, call order. Sized for 1 Gbit/s and up (8 MiB is 67 ms of a 1 Gbit/s link); "
        "on slower links give about 65 ms of the link (400K at 50 Mbit/s took 9% off an 8-host step), "
        "else the first layer's weights can wait behind up to a second of later layers' bytes"),
    Var("PS_SEND_LOWAT", "send_lowat", _bytes, 128 << 10,
        "with PS_SEND_WINDOW: bytes a connection's kernel send buffer may hold unsent before "
        "ps stops handing it more (as TCP_NOTSENT_LOWAT; Linux): the backlog then waits in ps's "
        "priority queue, where an urgent message can overtake it, and not in a FIFO socket "
        "buffer; 0 = off (only the window bounds it)"),
    Var("PS_CHUNK_BYTES", "chunk_bytes", _chunk_bytes, CHUNK_BYTES,
        f"bytes of a key that travel in one message (1M, 256K...; at least {CHUNK_MIN >> 10}K, rounded down to a multiple"
        " of 8): a larger slice goes and comes back in chunks of this size, so a big key streams and, "
        "with PS_SEND_WINDOW, an urgent key waits behind at most one chunk per connection; smaller chunks"
        " suit slow links and cost more messages; set the same value on every node of a job (the "
        "launchers pass it to all; workers that differ when the job forms are refused, naming both "
        "values, and so is a worker's restart with another value)"),
    Var("PS_TORCH_FUSION", "torch_fusion", _bytes, 0,
        "ps.torch's DistributedOptimizer: gradients smaller than this many bytes (1M, 256K...) "
        "travel together, consecutive ones (last layer first) in buckets of up to this size, one "
        "sum per bucket instead of one per parameter (Horovod's tensor fusion; the same numbers); "
        "larger gradients go on their own; 0 (default) = every gradient on its own"),
    Var("PS_LOCAL_IPC", "local_ipc", _bool, True,
        "1: a server also listens on an ipc:// twin that workers on its machine use instead of TCP; "
        "0: a server offers no twin and a worker uses none (TCP to its own machine too: to test or "
        "measure the network path on one machine)"),
    Var("PS_LOCAL_STREAM", "local_stream", _bool, True,
        "1: beside its ipc:// twin a node listens on a plain Unix stream socket, and a peer on its "
        "machine sends it ps's frames there, past libzmq's I/O threads (on one machine a 4 KB "
        "push-pull 1.2x, a 1 MB one 1.5-1.7x faster); never under PS_SECRET_FILE (CURVE); 0: "
        "peers on one machine use ZeroMQ's ipc:// twin"),
    Var("PS_SERVER_MALLOC_KEEP", "server_malloc_keep", _bytes, 16 << 20,
        "bytes of freed memory a server process's malloc keeps for its next rounds instead of "
        "returning them to the kernel, which would take them back page by page, zeroed (glibc "
        "only; at W4 S2 one 1 MB key's server spent twice the CPU without it); 0 leaves malloc "
        "as it is, and so does a malloc setting of your own (MALLOC_TRIM_THRESHOLD_, "
        "MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, or glibc.malloc in GLIBC_TUNABLES)"),
    Var("PS_DASHBOARD", "dashboard", _listen, None,
        "[HOST:]PORT: the scheduler serves a live dashboard of the job there: the page at /, /metrics for"
        " Prometheus, /api/... as JSON; HOST defaults to 127.0.0.1 (this machine only); port 0 picks a "
        "free one; python -m ps.launch --dashboard sets it. With PS_SECRET_FILE every request needs the "
        "dashboard token"),
    Var("PS_DASHBOARD_LINGER", "dashboard_linger", _float, 0.0,
        "seconds the dashboard stays up after the job ended, so its last state (who died, why) can "
        "still be read; the scheduler's process waits that long before it exits"),
    Var("PS_SECRET_FILE", "secret_file", _str, None,
        "file holding a shared secret: authenticate and encrypt all traffic (CURVE)"),
    Var("PS_JOB_KEY_FILE", "job_key_file", _str, None,
        "(python -m ps.launch writes one per job on one machine) file holding this job's signing key: "
        "workers sign pickled MXNet optimizers with it, servers unpickle only what it signs; "
        "PS_SECRET_FILE, if set, signs instead. It does not secure the traffic"),
    Var("PS_ALLOW_PICKLE", "allow_pickle", _bool, True,
        "1: a server runs MXNet optimizers ps has no numpy version of, pickled by a worker and "
        "HMAC-signed with PS_SECRET_FILE or PS_JOB_KEY_FILE (never unsigned); 0: refuse them"),
    Var("PS_MXNET_ENGINE", "mxnet_engine", _bool, True,
        "ps.mxnet: 1 runs a pushpull of one CPU array as an MXNet engine operation (overlaps "
        "with compute, like MXNet's own kvstore); 0: calls wait for their replies"),
    Var("PS_MXNET_AUTOLOAD", "mxnet_autoload", _bool, True,
        "python -m ps.launch: 1 puts ps's import hook on its processes' PYTHONPATH, so a script's "
        "plain `import mxnet` gets ps's dist_* kvstores (no line changed); 0: off (import ps.mxnet "
        "yourself)"),
    Var("PS_HOROVOD", "horovod", _auto_bool, "auto",
        "python -m ps.launch: 1 puts ps's horovod package (python -m ps.horovod --path) first on its "
        "processes' PYTHONPATH, so a script's import horovod.torch as hvd (or horovod.mxnet) gets ps's "
        "Horovod API (no line changed); auto: only when the launcher's Python finds no installed Horovod "
        "(a real one is never shadowed unless asked); 0: never"),
    Var("HOROVOD_TIMELINE", "timeline", _str, None,
        "ps.torch / ps.mxnet (Horovod's API): rank 0 writes a chrome://tracing file of its collectives to"
        " this path from init() on, as Horovod does; hvd.start_timeline(path) does the same at run time"),
    Var("HOROVOD_TIMELINE_MARK_CYCLES", "timeline_mark_cycles", _bool, False,
        "1: the timeline also marks CYCLE_START each time queued requests leave together"),
    Var("MXNET_ENGINE_TYPE", "mxnet_engine_type", _str, None,
        "MXNet's own; with NaiveEngine ps.mxnet keeps pushpulls outside the engine"),
    Var("MXNET_MKLDNN_ENABLED", "mxnet_mkldnn", _bool, True,
        "MXNet's own; 0: ps.mxnet writes pulled weights in place (MKL-DNN changes no layouts)"),
    Var("MXNET_KVSTORE_BIGARRAY_BOUND", "bigarray_bound", lambda n, r: _int(n, r, 1), 1_000_000,
        "arrays with at least this many elements are split across all servers"),
    Var("MXNET_KVSTORE_REDUCTION_NTHREADS", "reduction_nthreads", lambda n, r: _int(n, r, 1), 4,
        "threads a server may use to merge and update large arrays"),
)


def value_of(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One variable, parsed (its default when unset): for processes that are no node (the
    launcher; a Horovod-style script running alone)."""
    env = os.environ if environ is None else environ
    var = next(v for v in VARIABLES if v.name == name)
    raw = env.get(name)
    return var.default if raw is None else var.parse(name, raw)


class ManagerRank(NamedTuple):
    """A process that mpirun or srun started (not ps.launch): who it is, from their variables."""

    manager: str        # "Open MPI", "MPICH", "Slurm"
    rank: int
    size: int
    local_rank: int
    local_size: int
    multi_host: bool
    job_id: str          # the same in every rank of the job (a default port is derived from it)
    nodelist: str | None  # Slurm: the step's hosts (the first runs rank 0)


_MANAGERS = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"),
    ("MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_KVSNAME"),
    # srun's step variables: a batch script's own shell has SLURM_PROCID and SLURM_NTASKS but is no rank
    ("Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID"),
)


def manager_rank(environ: Mapping[str, str] | None = None) -> ManagerRank | None:
    """The rank mpirun (Open MPI, MPICH) or srun gave this process, or None. Only for a
    process with no ``DMLC_ROLE``: ps.launch's processes are told who they are."""
    env = os.environ if environ is None else environ
    for manager, rank, size, local_rank, local_size, job in _MANAGERS:
        if rank not in env or size not in env or (manager == "Slurm" and "SLURM_STEP_ID" not in env):
            continue
        n = _int(size, env[size], 1)
        if manager == "Slurm":
            nodes = _int("SLURM_STEP_NUM_NODES", env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1")), 1)
            job_id = f"{env.get(job, '')}.{env.get('SLURM_STEP_ID', '')}"
            return ManagerRank(manager, _int(rank, env[rank]), n, _int(local_rank, env.get(local_rank, "0")),
                               n // nodes, nodes > 1, job_id, env.get("SLURM_STEP_NODELIST", env.get("SLURM_NODELIST")))
        local_n = _int(local_size, env.get(local_size, env[size]), 1)
        return ManagerRank(manager, _int(rank, env[rank]), n, _int(local_rank, env.get(local_rank, "0")),
                           local_n, local_n < n, env.get(job, ""), None)
    return None


def role_from_env(environ: Mapping[str, str] | None = None) -> str:
    """Just DMLC_ROLE (default worker): what ``import ps.mxnet`` checks before importing mxnet."""
    env = os.environ if environ is None else environ
    return _role("DMLC_ROLE", env.get("DMLC_ROLE", "worker"))


@dataclass(frozen=True)
class Config:
    """Typed view of the environment. Build with :meth:`from_env`."""

    role: str = "worker"
    root_uri: str | None = None
    root_port: int | None = None
    num_servers: int | None = None
    num_workers: int | None = None
    interface: str | None = None
    node_host: str | None = None
    local: bool = False
    use_kubernetes: bool = False
    rank_hint: int | None = None
    port: int = 0
    port_range: tuple[int, int] | None = None
    verbose: int = 0
    resend: bool = False
    resend_timeout: int = 1000
    drop_msg: float = 0.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 30.0
    connect_timeout: float = 120.0
    request_timeout: float = 0.0
    stall_warning: float = 60.0
    deadlock_check: float = 1.0
    max_restarts: int = 0
    send_window: int = 8 << 20
    send_lowat: int = 128 << 10
    chunk_bytes: int = CHUNK_BYTES
    torch_fusion: int = 0
    local_ipc: bool = True
    local_stream: bool = True
    server_malloc_keep: int = 16 << 20
    dashboard: Listen | None = None
    dashboard_linger: float = 0.0
    secret_file: str | None = None
    job_key_file: str | None = None
    allow_pickle: bool = True
    mxnet_engine: bool = True
    mxnet_autoload: bool = True
    horovod: str = "auto"
    mxnet_engine_type: str | None = None
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    mxnet_mkldnn: bool = True
    bigarray_bound: int = 1_000_000
    reduction_nthreads: int = 4
    # not a variable: the server of a joint process (ps/joint.py), which its worker reaches in-process
    in_process_peers: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Config":
        """Parse ``environ`` (default ``os.environ``); keyword overrides win.

        Raises ConfigError naming the variable for a missing required or malformed value.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var in VARIABLES:
            raw = env.get(var.name)
            if raw is None or var.field in values:  # an earlier name (PORT over DMLC_PORT) wins
                continue
            values[var.field] = var.parse(var.name, raw)
        if any(name in env for name in MALLOC_OWN) or "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
            values["server_malloc_keep"] = 0        # the user tuned glibc's malloc: theirs wins
        values.update(overrides)
        if values.get("role") == "joint" and values.get("num_servers") is None:
            values["num_servers"] = values.get("num_workers")     # one shard per joint process
        for var in VARIABLES:
            if var.required and values.get(var.field) is None:
                raise ConfigError(f"{var.name} is not set: every ps process needs it ({var.doc})")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.drop_msg > 100:
            raise ConfigError(f"PS_DROP_MSG must be a percentage 0-100, got {self.drop_msg}")
        if self.heartbeat_interval and self.heartbeat_timeout and \
                self.heartbeat_timeout < 2 * self.heartbeat_interval:
            raise ConfigError(
                f"PS_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout}) must be at least twice "
                f"PS_HEARTBEAT_INTERVAL ({self.heartbeat_interval})")
        if self.role == "joint" and self.num_servers != self.num_workers:
            raise ConfigError(f"DMLC_ROLE=joint: every process is one worker and one server, so DMLC_NUM_SERVER "
                              f"({self.num_servers}) must equal DMLC_NUM_WORKER ({self.num_workers}); leave "
                              "DMLC_NUM_SERVER unset")
        if self.root_port == 0 and self.role != "scheduler":
            raise ConfigError("DMLC_PS_ROOT_PORT must name the scheduler's port, got '0'")

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    @property
    def is_joint(self) -> bool:
        """A worker that also holds a server shard on threads of its own process (ps/joint.py)."""
        return self.role == "joint"

    @property
    def is_server(self) -> bool:
        return self.role == "server"

    @property
    def is_scheduler(self) -> bool:
        return self.role == "scheduler"
