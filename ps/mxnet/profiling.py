"""MXNet's server profiling (``mx.profiler.*(profile_process='server')``) routed to ps's
servers: MXNet sends those calls through its C++ kvstore's handle, which a ps store has not."""
from __future__ import annotations

import functools
import inspect
from typing import Any

import mxnet as mx

from .kvstore import shared_store


def patch_profiler() -> None:
    """MXNet sends ``profile_process='server'`` calls through its C++ kvstore's handle, which
    a ps store has not (MXNet would fail with "KVStoreHandle passed to profiler is null"):
    here they go to ps's servers as a "profiler" command, from rank 0 as MXNet's kvstore
    sends them. The servers write a Chrome trace of their own work (ps/server/profiler.py)."""
    for name in ("set_config", "set_state", "dump", "pause", "resume"):
        original = getattr(mx.profiler, name)
        if getattr(original, "_ps_patched", False):
            continue
        signature = inspect.signature(original)

        def routed(*args: Any, _name: str = name, _original: Any = original, _signature: Any = signature,
                   **kwargs: Any) -> Any:
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            extra = arguments.pop("kwargs", None) or {}       # set_config(**kwargs)
            arguments.update(extra)
            if arguments.get("profile_process", "worker") != "server":
                return _original(*args, **kwargs)
            _profile_servers(_server_profiler_body(_name, arguments))
        routed = functools.wraps(original)(routed)
        routed._ps_patched = True
        setattr(mx.profiler, name, routed)


_PROFILER_CONFIG = frozenset(("profile_all", "profile_symbolic", "profile_imperative", "profile_memory", "profile_api",
                              "filename", "continuous_dump", "dump_period", "aggregate_stats"))


def _server_profiler_body(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The "profiler" server command for MXNet's ``mx.profiler.<name>(...)``."""
    if name == "set_config":
        params = {k: v for k, v in arguments.items() if k != "profile_process"}
        unknown = sorted(set(params) - _PROFILER_CONFIG)
        if unknown:       # MXNet's ProfileConfigParam refuses them too
            raise mx.base.MXNetError(f"profiler config has no parameter {unknown[0]!r}; it takes "
                                     f"{', '.join(sorted(_PROFILER_CONFIG))} and profile_process")
        return {"action": "config", "params": {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                                               for k, v in params.items()}}
    if name == "set_state":
        state = arguments.get("state")
        if state not in ("run", "stop"):
            raise ValueError(f"profiler state {state!r}: 'run' or 'stop'")
        return {"action": "state", "run": state == "run"}
    if name == "dump":
        return {"action": "dump", "finished": bool(arguments.get("finished", True))}
    return {"action": "pause", "paused": name == "pause"}


def _profile_servers(body: dict[str, Any]) -> None:
    store = shared_store()
    if store is None:
        raise mx.base.MXNetError("server profiling needs this process's dist kvstore: create it first "
                                 "(mx.kv.create('dist_sync'), or a Trainer's first step), as in MXNet")
    if store.rank == 0:            # MXNet's kvstore sends server profiler commands from rank 0 only
        store.server_command("profiler", body)
