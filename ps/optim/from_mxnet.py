"""Translate an MXNet 1.9.1 optimizer object into a ps optimizer spec.

Servers never unpickle optimizers, so the worker describes the MXNet optimizer as
data. mxnet is imported lazily: ``ps`` must import without it.

    spec = spec_from_mxnet(trainer._optimizer)      # then msgpack -> servers -> from_spec
"""
from __future__ import annotations

import logging
import numbers
from collections.abc import Iterable
from typing import Any

from .base import REGISTRY

logger = logging.getLogger(__name__)

# MXNet class name -> (ps name, optimizer-specific attributes as {spec param: MXNet attribute}).
_OPTIMIZERS: dict[str, tuple[str, dict[str, str]]] = {
    "SGD": ("sgd", {"momentum": "momentum", "lazy_update": "lazy_update"}),
    "ccSGD": ("sgd", {"momentum": "momentum", "lazy_update": "lazy_update"}),
    "NAG": ("nag", {"momentum": "momentum"}),
    "Adam": ("adam", {"beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon",
                      "lazy_update": "lazy_update"}),
    "AdaGrad": ("adagrad", {"eps": "float_stable_eps"}),
    "RMSProp": ("rmsprop", {"gamma1": "gamma1", "gamma2": "gamma2", "epsilon": "epsilon",
                            "centered": "centered", "clip_weights": "clip_weights"}),
    "AdaDelta": ("adadelta", {"rho": "rho", "epsilon": "epsilon"}),
    "Signum": ("signum", {"momentum": "momentum", "wd_lh": "wd_lh"}),
    "Ftrl": ("ftrl", {"lamda1": "lamda1", "beta": "beta"}),
    "LAMB": ("lamb", {"beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon",
                      "lower_bound": "lower_bound", "upper_bound": "upper_bound",
                      "bias_correction": "bias_correction"}),
    "Test": ("test", {}),
}

# MXNet scheduler class name -> (ps name, specific attributes as {spec param: MXNet attribute}).
_SCHEDULERS: dict[str, tuple[str, dict[str, str]]] = {
    "FactorScheduler": ("factor", {"step": "step", "factor": "factor",
                                   "stop_factor_lr": "stop_factor_lr", "count": "count"}),
    "MultiFactorScheduler": ("multifactor", {"step": "step", "factor": "factor",
                                             "cur_step_ind": "cur_step_ind", "count": "count"}),
    "PolyScheduler": ("poly", {"max_update": "max_update", "pwr": "power", "final_lr": "final_lr",
                               "base_lr_orig": "base_lr_orig"}),
    "CosineScheduler": ("cosine", {"max_update": "max_update", "final_lr": "final_lr",
                                   "base_lr_orig": "base_lr_orig"}),
}
_WARMUP = {"base_lr": "base_lr", "warmup_steps": "warmup_steps", "warmup_begin_lr": "warmup_begin_lr",
           "warmup_mode": "warmup_mode", "warmup_final_lr": "warmup_final_lr"}


def _plain(x: Any) -> Any:
    """Numbers as Python int/float (numpy scalars are not msgpack-able), lists recursively."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, numbers.Integral):
        return int(x)
    return float(x)


def _genuine(obj: Any, module: Any, table: dict) -> str | None:
    """The class name if ``obj`` is exactly one of MXNet's own classes (a subclass may change the math)."""
    name = type(obj).__name__
    return name if name in table and getattr(module, name, None) is type(obj) else None


def _scheduler_spec(sched: Any) -> dict[str, Any] | None:
    if sched is None:
        return None
    import mxnet as mx
    cls = _genuine(sched, mx.lr_scheduler, _SCHEDULERS)
    if cls is None:
        raise ValueError(f"ps has no server-side implementation of lr_scheduler {type(sched).__name__!r}; "
                         f"known: {', '.join(sorted(_SCHEDULERS))}")
    name, attrs = _SCHEDULERS[cls]
    return {"name": name, "params": {k: _plain(getattr(sched, a)) for k, a in {**_WARMUP, **attrs}.items()}}


def _mult(opt: Any, key: Any, attr: str) -> float:
    """The multiplier MXNet's ``_get_lrs``/``_get_wds`` would apply to ``key``.

    A str key is a parameter name: it resolves through ``idx2name`` when it is there
    (so the index rules apply), else through name entries of ``lr_mult``/``wd_mult``.
    """
    table = getattr(opt, attr)
    if isinstance(key, str):
        idx = next((i for i, n in opt.idx2name.items() if n == key), None)
        if idx is None:
            return float(table.get(key, 1.0))
        key = idx
    if key in opt.param_dict:
        return float(getattr(opt.param_dict[key], attr))
    if key in table:
        return float(table[key])
    if key in opt.idx2name:
        return float(table.get(opt.idx2name[key], 1.0))
    return 1.0


def _default_keys(opt: Any) -> list[int]:
    """Every int index MXNet could resolve a multiplier for (a dist server only ever sees ints)."""
    keys = set(opt.param_dict) | set(opt.idx2name)
    keys |= {k for k in (*opt.lr_mult, *opt.wd_mult) if isinstance(k, int) and not isinstance(k, bool)}
    return sorted(keys)


def _multipliers(opt: Any, keys: Iterable[Any] | None) -> tuple[dict, dict]:
    lr_mult, wd_mult = {}, {}
    for key in _default_keys(opt) if keys is None else keys:
        lm, wm = _mult(opt, key, "lr_mult"), _mult(opt, key, "wd_mult")
        if lm != 1.0:
            lr_mult[key] = lm
        if wm != 1.0:
            wd_mult[key] = wm
    return lr_mult, wd_mult


def spec_from_mxnet(opt: Any, keys: Iterable[Any] | None = None) -> dict[str, Any]:
    """Describe an ``mx.optimizer.Optimizer`` as a ps spec (see :func:`ps.optim.from_spec`).

    Per-key ``lr_mult``/``wd_mult`` are resolved now, as MXNet's ``_get_lrs``/``_get_wds``
    would: ``param_dict`` (Gluon Trainer), then the optimizer's own dicts, then ``idx2name``
    (Module; MXNet gives wd_mult 0 to names not ending in ``_weight``/``_gamma``). Only
    multipliers other than 1 are listed, keyed as the caller keys the store: pass ``keys``
    for a str-keyed store; by default the int indices the optimizer knows are used.
    Later changes to the MXNet object (e.g. ``Parameter.lr_mult``) need a new spec.

    Raises
    ------
    ValueError
        ps has no server-side implementation of the optimizer or of its lr scheduler.

    Example::

        spec = spec_from_mxnet(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9))
    """
    import mxnet as mx
    cls = _genuine(opt, mx.optimizer, _OPTIMIZERS)
    if cls is None:
        raise ValueError(f"ps has no server-side implementation of optimizer {type(opt).__name__!r}; "
                         f"known: {', '.join(sorted(REGISTRY))}")
    name, attrs = _OPTIMIZERS[cls]
    lr_mult, wd_mult = _multipliers(opt, keys)
    sched = _scheduler_spec(opt.lr_scheduler)
    params = {
        # With a scheduler MXNet never reads opt.lr, and its base_lr override already happened.
        "learning_rate": None if sched is not None else _plain(opt.lr),
        "wd": _plain(opt.wd), "rescale_grad": _plain(opt.rescale_grad),
        "clip_gradient": _plain(opt.clip_gradient), "multi_precision": bool(opt.multi_precision),
        "begin_num_update": int(opt.begin_num_update), "num_update": int(opt.num_update),
        "lr_scheduler": sched, "lr_mult": lr_mult, "wd_mult": wd_mult,
    }
    params.update({k: _plain(getattr(opt, a)) for k, a in attrs.items()})
    return {"name": name, "params": params}
