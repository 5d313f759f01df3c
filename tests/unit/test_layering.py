"""Imports only point down (style R2): roles never import each other."""
import ast
from pathlib import Path

PS = Path(__file__).resolve().parents[2] / "ps"

# module -> the ps modules it may import (at any depth of the file)
ALLOWED = {
    "errors": set(), "_timing": {"errors"}, "config": {"errors"}, "keys": set(),
    "message": {"errors"}, "compression": set(), "_security": {"errors"}, "_logging": set(),
    "netutil": {"config", "errors"}, "optim": {"lr_scheduler", "_mxnumerics"}, "lr_scheduler": set(),
    "_mxnumerics": set(),
    "van": {"van.base", "van.zmq_van", "van.inproc_van", "van.reliable", "_security"},
    "van.base": {"message"}, "van.zmq_van": {"errors", "message", "van.base"},
    "van.inproc_van": {"errors", "message", "van.base"}, "van.reliable": {"message", "van.base"},
    "customer": {"_timing", "errors", "message"},
    "bufguard": set(),
    "store": {"bufguard", "compression", "keys", "message"},
    "postoffice": {"netutil", "_timing", "config", "errors", "message", "van"},
    "scheduler": {"netutil", "config", "errors", "message", "van"},
    "worker": {"_timing", "customer", "errors", "keys", "message", "postoffice"},
    "server": {"bufguard", "compression", "optim", "config", "errors", "keys", "message", "postoffice", "store", "van",
               "_pickled", "_security"},
    "_pickled": set(),
    "kvstore": {"compression", "keys", "config", "customer", "errors", "message", "postoffice", "van",
                "worker", "_timing", "_logging"},
    "testing": {"config", "errors", "kvstore", "scheduler", "server", "van"},
    "mxnet": {"config", "__main__", "kvstore", "_mxengine", "_mxnet_optim", "_pickled", "_security", "errors",
              "_timing"},
    "_mxengine": set(),
    "_mxnet_optim": {"optim", "lr_scheduler"},
    "__main__": {"_logging", "config", "errors", "scheduler", "server"},
    "__init__": {"optim", "config", "customer", "errors", "kvstore"},
}


def ps_imports(path: Path, package: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level > 1 else \
                package.split(".")
            base = [p for p in base if p]
            mod = ".".join(base[1:] + ([node.module] if node.module else []))
            if mod:
                found.add(mod)
            else:
                found.update(".".join(base[1:] + [a.name]).lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name[3:] for a in node.names if a.name.startswith("ps."))
    return found


def test_imports_follow_the_layering():
    bad = []
    for path in PS.rglob("*.py"):
        rel = path.relative_to(PS).with_suffix("")
        name = ".".join(rel.parts).replace(".__init__", "") if rel.parts[-1] == "__init__" and len(rel.parts) > 1 \
            else ".".join(rel.parts)
        if name not in ALLOWED:
            continue       # bench and helper modules are leaves nothing imports
        package = "ps." + ".".join(rel.parts[:-1]) if len(rel.parts) > 1 else "ps"
        for imp in ps_imports(path, package):
            if imp and imp not in ALLOWED[name] and imp != name:
                bad.append(f"{name} imports {imp}")
    assert not bad, "\n".join(sorted(bad))
