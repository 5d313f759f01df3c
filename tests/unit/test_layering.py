"""Imports only point down (style R2): roles never import each other, the core never
imports its adapters, the Horovod layer, optimizers or benchmarks. Every module of ``ps`` must be in the
table: a new module without an entry fails the test, so its place is decided on purpose."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PS = ROOT / "ps"

# the packages built on the core: the Horovod layer, the framework adapters, the benchmarks
ABOVE_THE_CORE = ("collective", "torch", "mxnet", "bench")

# module -> the modules it may import (ps modules by their name under ps/; "__init__" is
# `import ps`; launcher modules by their full name)
ALLOWED = {
    # the core, bottom up
    "errors": set(), "_logging": set(), "keys": set(), "childproc": set(), "exitcodes": set(),
    "_timing": {"errors"}, "config": {"errors", "keys"}, "pslite": {"errors"},
    "message": {"errors", "frames", "pslite"},      # frames lazily, at a first DATA message (a scheduler has none)
    "compression": {"message"}, "frames": {"compression", "errors", "message"},
    "_security": {"errors"},
    "netutil": {"config", "errors"},
    "van.base": {"errors", "message"},
    "van.zmq_watch": set(),
    "van.in_process": set(),
    "van.zmq_van": {"errors", "message", "van.base", "van.dealers", "van.in_process", "van.handoff", "van.router",
                    "van.sendbuf", "van.stream", "van.streams", "van.traffic", "van.twin", "van.zmq_watch"},
    "van.router": {"errors", "van.in_process", "van.twin"},
    "van.dealers": {"van.base", "van.in_process"},
    "van.traffic": set(),
    "van.twin": set(),
    "van.sendbuf": set(),
    "van.stream": {"errors", "message"},
    "van.streams": {"errors", "van.stream"},
    "van.handoff": {"errors"},
    "van.inproc_van": {"errors", "message", "van.base"},
    "van.reliable": {"message", "van.base"},
    "van": {"van.base", "van.zmq_van", "van.inproc_van", "van.reliable", "_security"},
    "customer": {"_timing", "errors", "message", "nodestats"},
    "nodestats": set(), "jobview": {"nodestats"},
    "ring": set(), "check": {"kvstore", "message"},
    "rejoin": {"message"},
    "schedlink": {"_timing", "config", "errors", "message", "van"},
    "peerlinks": {"message", "van"},
    "postoffice": {"_timing", "barrierwait", "config", "errors", "frames", "message", "netutil", "nodestats",
                   "peerlinks", "rejoin", "ring", "schedlink", "van"},
    "barrierwait": {"_timing", "errors", "waits"},
    "waits": set(),
    "waitjudge": {"message", "waits"},
    "waitreport": {"_timing", "customer", "errors", "message", "waits"},
    "membership": {"message", "ring"},
    "formation": {"_timing", "config", "membership", "message", "ring", "van"},
    "barriers": {"membership", "message"},
    "ending": {"message"},
    "rebuild": {"barriers", "membership", "message", "rejoin"},
    "readmission": {"barriers", "config", "membership", "message", "rebuild", "van"},
    "scheduler": {"_timing", "barriers", "config", "dashboard", "ending", "errors", "formation", "jobview",
                  "membership", "message", "netutil", "readmission", "rebuild", "rejoin", "van", "waitjudge"},
    # the dashboard: the scheduler's picture of the job (jobview) served over HTTP
    "dashboard.metrics": {"jobview", "nodestats"},
    "dashboard.server": {"_security", "config", "errors", "jobview", "dashboard.metrics"},
    "dashboard": {"dashboard.server"},
    "sendqueue": {"frames", "keys", "message"},
    "drain": {"van.base"},       # it paces the van's ticks (Van.add_tick)
    "worker": {"_timing", "customer", "drain", "errors", "frames", "keys", "message", "nodestats", "postoffice",
               "sendqueue"},
    # the server role: the rest of ps imports only the package (KVServer), see
    # test_the_core_never_imports_the_server_internals
    "server.events": set(), "server.updaters": set(), "server.bufguard": set(), "server.profiler": set(),
    "server.rounds": {"frames", "keys", "message"},
    "server.quorum": {"message", "server.events", "server.rounds"},
    "server.values": {"frames", "keys", "message", "server.bufguard", "server.events", "server.rounds",
                      "server.updaters"},
    "server.restarts": {"message", "server.events", "server.quorum", "server.rounds", "server.updaters",
                        "server.values"},
    "server.store": {"compression", "frames", "keys", "message", "server.bufguard", "server.events",
                     "server.quorum", "server.restarts", "server.rounds", "server.updaters", "server.values"},
    "server.replica": {"errors", "frames", "message", "optim", "server.events", "server.store", "server.tables",
                       "server.updaters"},
    "server.replies": {"drain", "frames", "message", "postoffice", "sendqueue", "server.bufguard",
                       "server.profiler", "server.rounds"},
    "server.replication": {"_timing", "errors", "message", "postoffice", "ring", "server.events", "server.replica",
                           "server.replies", "server.rounds", "server.store", "server.tables"},
    "server.tablestate": {"embed.spec", "embed.table", "frames", "message"},
    "server.tablejournal": {"embed.spec", "embed.table", "errors", "server.events", "server.tablestate"},
    "server.tables": {"embed.limits", "embed.spec", "embed.table", "errors", "frames", "message", "server.events",
                      "server.rounds", "server.tablejournal", "server.tablestate"},
    "server.kvserver": {"_security", "_timing", "compression", "config", "errors", "message", "nodestats", "optim",
                        "optim.pickled", "postoffice", "server.bufguard", "server.events", "server.imports",
                        "server.profiler",
                        "server.replication", "server.replies", "server.rounds", "server.store", "server.tables",
                        "server.updaters",
                        "van"},
    "server": {"server.kvserver", "server.malloc"},
    "server.malloc": set(),
    "server.imports": {"message", "optim", "optim.pickled"},
    "keyinfo": {"frames", "keys", "message"},
    # embedding tables: pure but for the worker's requests (client); the server's rounds are server.tables
    "embed.hashing": set(), "embed.index": {"embed.hashing"}, "embed.init": {"embed.hashing"},
    "embed.limits": {"embed.hashing"},
    "embed.spec": {"embed.hashing", "embed.init", "embed.limits", "optim.rowwise"},
    "embed.table": {"embed.hashing", "embed.index", "embed.init", "embed.limits", "embed.spec"},
    "embed.client": {"customer", "embed.hashing", "embed.spec", "embed.table", "frames", "message", "worker"},
    "embed.checkpoint": {"embed.spec", "embed.table"},
    "embed.serving": {"embed.hashing", "embed.init", "embed.spec"},
    "embed": {"embed.checkpoint", "embed.client", "embed.init", "embed.limits", "embed.serving", "embed.spec",
              "optim.rowwise"},
    # a joint process's server shard: the worker's store starts it (DMLC_ROLE=joint)
    "joint": {"config", "errors", "server"},
    "kvstore": {"_logging", "_timing", "compression", "config", "customer", "embed", "errors", "frames", "joint",
                "keyinfo", "keys", "message", "postoffice", "van", "waitreport", "worker"},
    "testing": {"config", "errors", "kvstore", "scheduler", "server", "van"},
    "__main__": {"_logging", "_security", "config", "errors", "exitcodes", "mxnet_autoload", "scheduler", "server"},
    "__init__": {"config", "customer", "errors", "kvstore", "optim"},
    "launch": {"launcher.launch"},
    "mxnet_autoload": set(),
    # optimizers: pure numpy, import nothing of the runtime
    "optim.numerics": set(), "optim.lr_scheduler": set(), "optim.pickled": set(),
    "optim.base": {"optim.lr_scheduler", "optim.numerics"},
    "optim.rules": {"optim.base", "optim.numerics"},
    "optim.updater": {"optim.base", "optim.lr_scheduler"},
    "optim.from_mxnet": {"optim.base"},
    "optim.torch_rules": {"optim.base"},
    "optim.rowwise": set(),
    "optim": {"optim.base", "optim.lr_scheduler", "optim.rules", "optim.torch_rules", "optim.updater"},
    # Horovod's layer under both adapters: the public KVStore, never the roles
    "collective.selfstart": {"_timing", "childproc", "config", "errors", "netutil"},
    "collective.objects": {"_security"}, "collective.ops": set(), "collective.timeline": set(),
    "collective.names": {"collective.timeline"},
    "collective.job": {"collective.names", "collective.ops", "collective.selfstart", "collective.timeline", "config",
                       "errors", "kvstore"},
    "collective.process_sets": {"collective.job", "collective.names", "errors"},
    "collective": {"collective.job", "collective.names", "collective.ops"},
    # the MXNet adapter: the public KVStore, never the roles
    "mxnet.arrays": set(), "mxnet.engine": set(),
    "mxnet.engine_ops": {"_timing", "kvstore", "mxnet.arrays", "mxnet.engine"},
    "mxnet.optimizer": {"_security", "errors", "kvstore", "mxnet.arrays", "mxnet.engine_ops",
                        "optim.from_mxnet", "optim.pickled"},
    "mxnet.kvstore": {"collective.selfstart", "config", "errors", "kvstore", "mxnet.arrays", "mxnet.engine_ops",
                      "mxnet.optimizer"},
    "mxnet.hooks": {"mxnet.engine_ops", "mxnet.kvstore"},
    "mxnet.collectives": {"collective", "collective.objects", "collective.ops", "collective.process_sets",
                          "errors"},
    "mxnet.horovod": {"collective", "collective.process_sets", "mxnet.collectives"},
    "mxnet.profiling": {"mxnet.kvstore"},
    "mxnet": {"__main__", "collective", "config", "errors", "optim.pickled", "mxnet.collectives", "mxnet.horovod", "mxnet.hooks",
              "mxnet.kvstore", "mxnet.profiling"},
    "mxnet.autoload.sitecustomize": {"config", "mxnet"},   # python startup hook: imports ps.mxnet lazily
    # the PyTorch adapter (Horovod's API): the public KVStore only
    "torch.compression": set(), "torch.runtime": {"collective"},
    "torch.process_sets": {"collective.process_sets", "torch.runtime"},
    "torch.sums": {"collective", "collective.ops", "errors", "torch.compression", "torch.process_sets",
                   "torch.runtime"},
    "torch.gather": {"collective", "collective.objects", "collective.ops", "errors", "torch.compression",
                     "torch.process_sets",
                     "torch.runtime", "torch.sums"},
    "torch.cross_barrier": set(),
    "torch.fusion": set(),
    "torch.optimizer": {"collective", "keys", "torch.compression", "torch.cross_barrier", "torch.fusion", "torch.gather", "torch.process_sets", "torch.runtime",
                        "torch.sums"},
    "torch.ops": {"collective", "collective.objects", "collective.process_sets", "errors", "torch.compression",
                  "torch.gather", "torch.optimizer", "torch.process_sets", "torch.runtime", "torch.sums"},
    "torch.server_optimizer": {"optim", "torch.runtime", "torch.sums"},
    "torch.sync_batch_norm": {"collective", "torch.ops", "torch.runtime"},
    "torch.elastic": {"torch.ops", "torch.runtime"},
    "torch.embedding": {"embed", "embed.checkpoint", "embed.serving", "optim.rowwise", "torch.runtime"},
    "torch": {"collective", "errors", "torch.compression", "torch.elastic", "torch.embedding", "torch.gather", "torch.ops", "torch.optimizer", "torch.process_sets",
              "torch.runtime", "torch.server_optimizer", "torch.sync_batch_norm"},
    # zero-edit Horovod scripts: the launcher reads ps.horovod (no framework import); the
    # `horovod` package it puts on PYTHONPATH (site/horovod) is the adapters under Horovod's names
    "horovod": {"config"}, "horovod.__main__": {"exitcodes", "horovod"},
    "horovod.site.horovod": set(),
    "horovod.site.horovod.torch": {"torch", "horovod.site.horovod.torch.elastic"},
    "horovod.site.horovod.torch.mpi_ops": {"torch"},
    "horovod.site.horovod.torch.elastic": {"torch.elastic"},
    "horovod.site.horovod.torch.elastic.sampler": {"torch.elastic"},
    "horovod.site.horovod.torch.elastic.state": {"torch.elastic"},
    "horovod.site.horovod.mxnet": {"mxnet"},
    "horovod.site.horovod.common": set(), "horovod.site.horovod.common.exceptions": {"errors"},
    "horovod.site.horovod.common.util": set(),
    "horovod.site.horovod.runner": set(), "horovod.site.horovod.runner.util": set(),
    "horovod.site.horovod.runner.util.threads": set(),
    # benchmarks: drive real processes; only their workers import ps
    "bench": set(), "bench.measure": set(), "bench.report": set(),
    "bench.cluster": {"bench.measure", "launcher.process", "netutil"},
    "bench.gluon": {"mxnet"},
    "bench.worker": {"__init__", "bench.gluon"},
    "bench.soak": {"__init__", "launcher.process", "netutil"},
    "bench.chaos": {"__init__", "embed", "embed.checkpoint", "launcher.process", "netutil", "optim.rowwise"},
    "bench.sparse": {"launcher.process", "mxnet", "netutil"},
    "bench.torch": {"bench.cluster", "launcher.process", "netutil", "torch"},
    "bench.ctr": {"embed", "embed.hashing"},
    "bench.capacity": {"bench.cluster", "bench.measure", "embed", "netutil", "optim.rowwise", "torch"},
    "bench.embedding": {"bench.cluster", "bench.ctr", "bench.measure", "bench.netns", "embed", "embed.table",
                        "netutil", "optim.rowwise", "torch"},
    "bench.cli": {"bench.cluster", "bench.gluon", "bench.measure", "bench.report", "netutil"},
    "bench.__main__": {"bench.cli", "bench.multihost"},
    "bench.netns": set(),
    "bench.multihost": {"bench.footprint", "bench.kvstore_step", "bench.linkload", "bench.measure", "bench.multihost_report", "bench.netns",
                        "bench.torch_step", "config", "keys", "launcher.process"},
    "bench.kvstore_step": {"__init__"}, "bench.multihost_report": {"bench.measure"},
    "bench.torch_step": {"torch"},
    "bench.linkload": {"bench.netns"}, "bench.footprint": set(),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def _is_module(parts: list[str]) -> bool:
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _package_defines(parts: list[str], name: str) -> bool:
    """``from pkg import name`` names a function, class or value of the package, not its
    submodule, when its __init__ defines one by that name (``ps.van.reliable``)."""
    init = ROOT.joinpath(*parts) / "__init__.py"
    if not init.exists():
        return False
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _short(parts: list[str]) -> str:
    if parts[0] == "ps":
        return ".".join(parts[1:]) or "__init__"
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The ps and launcher modules ``path`` imports, at any depth of the file."""
    pkg = ["ps", *path.relative_to(PS).parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            if mod[:1] not in (["ps"], ["launcher"]):
                continue
            for alias in node.names:
                sub = [*mod, alias.name]
                named_module = _is_module(sub) and not _package_defines(mod, alias.name)
                found.add(_short(sub if named_module else mod))
        elif isinstance(node, ast.Import):
            found.update(_short(a.name.split(".")) for a in node.names if a.name.split(".")[0] in ("ps", "launcher"))
    return found


def test_every_module_has_a_place_in_the_table():
    missing = sorted(module_name(p) for p in PS.rglob("*.py") if module_name(p) not in ALLOWED)
    assert not missing, f"add these modules to ALLOWED in {Path(__file__).name}: {missing}"


MAX_LINES = 500


def test_no_module_is_over_500_lines():
    """A module that grows past this holds more than one job: split it by responsibility."""
    long = sorted(f"{p.relative_to(ROOT)} ({n} lines)" for p in [*PS.rglob("*.py"), *(ROOT / "launcher").rglob("*.py")]
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_imports_follow_the_layering():
    bad = []
    for path in PS.rglob("*.py"):
        name = module_name(path)
        for imp in imports_of(path):
            if imp != name and imp not in ALLOWED.get(name, set()):
                bad.append(f"{name} imports {imp}")
    assert not bad, "\n".join(sorted(bad))


def test_the_core_never_imports_the_horovod_layer():
    """``ps.collective`` is built on the public KVStore for the adapters: no module of the
    core (every one but the layer itself, the adapters and the benchmarks) imports it, so the
    core runs without it and no cycle can form through it."""
    bad = []
    for path in PS.rglob("*.py"):
        name = module_name(path)
        if name.split(".")[0] not in ABOVE_THE_CORE:
            bad += [f"{name} imports {imp}" for imp in imports_of(path) if imp.split(".")[0] == "collective"]
    assert not bad, "\n".join(sorted(bad))


def test_the_check_sees_a_role_importing_another():
    """The import scan itself works: it finds the worker's import of the postoffice, and a
    server module importing the worker would be reported."""
    assert "postoffice" in imports_of(PS / "worker.py")
    assert "worker" not in ALLOWED["server"]
    assert "worker" not in ALLOWED["server.kvserver"]


ENTRY_POINTS = ("__main__", "testing", "joint")     # they start a server: the package's KVServer, nothing else


def server_imports(name: str, found: set[str]) -> list[str]:
    """What of ``found`` (a module's imports) breaks the rule that the core never imports
    ``ps.server``, and the entry points only the package, never a module inside it."""
    if name == "server" or name.startswith("server."):
        return []
    if name in ENTRY_POINTS:
        return sorted(imp for imp in found if imp.startswith("server."))
    return sorted(imp for imp in found if imp == "server" or imp.startswith("server."))


def test_the_core_never_imports_the_server_internals():
    bad = [f"{module_name(path)} imports {imp}" for path in PS.rglob("*.py")
           for imp in server_imports(module_name(path), imports_of(path))]
    assert not bad, "\n".join(sorted(bad))


def test_the_server_rule_sees_what_it_forbids():
    assert server_imports("worker", {"message", "server"}) == ["server"]
    assert server_imports("mxnet.kvstore", {"server.store"}) == ["server.store"]
    assert server_imports("testing", {"server", "server.kvserver"}) == ["server.kvserver"]
    assert server_imports("__main__", {"server"}) == []
    assert server_imports("server.kvserver", {"server.store", "postoffice"}) == []
