"""Server-side optimizers in numpy, with MXNet 1.9.1's update rules (``docs/optimizers.md``).

Optimizers travel as a msgpack-able *spec* (``{"name": ..., "params": {...}}``), never as
code: a server only builds optimizers from :data:`REGISTRY`. The modules, each with one job:

* ``base``: the :class:`Optimizer` base (hyper-parameters, lr/wd multipliers, update
  counts, the lr schedule), the registry and :func:`from_spec`;
* ``rules``: the update rules (sgd, nag, adam, adagrad, rmsprop, adadelta, signum, ftrl, lamb, and
  MXNet's ``test``);
* ``numerics``: MXNet's arithmetic (float32 parsing of hyper-parameters, its powf, ...);
* ``updater``: :class:`Updater`, one optimizer applied to many keys, states saved without pickle;
* ``lr_scheduler``: MXNet's learning-rate schedulers;
* ``from_mxnet``: an ``mx.optimizer.Optimizer`` object -> spec (imports mxnet lazily);
* ``pickled``: the opt-in, HMAC-signed path for MXNet optimizers ps has no rule for;
* ``torch_rules``: PyTorch's SGD and Adam with torch's own kernels (``ps.torch.ServerOptimizer``;
  imports torch lazily).

Importing ``ps.optim`` never imports mxnet.
"""
from __future__ import annotations

from .base import REGISTRY, Optimizer, from_spec, modules_of, register
from .lr_scheduler import (SCHEDULERS, CosineScheduler, FactorScheduler, LRScheduler,
                           MultiFactorScheduler, PolyScheduler, scheduler_from_spec)
from .rules import LAMB, NAG, SGD, AdaDelta, AdaGrad, Adam, Ftrl, RMSProp, Signum, Test
from .torch_rules import TorchAdam, TorchSGD
from .updater import Updater

__all__ = [
    "REGISTRY", "Optimizer", "Updater", "from_spec", "modules_of", "register",
    "SGD", "NAG", "Adam", "AdaGrad", "RMSProp", "AdaDelta", "Signum", "Ftrl", "LAMB", "Test", "TorchSGD", "TorchAdam",
    "LRScheduler", "FactorScheduler", "MultiFactorScheduler", "PolyScheduler", "CosineScheduler",
    "SCHEDULERS", "scheduler_from_spec",
]
