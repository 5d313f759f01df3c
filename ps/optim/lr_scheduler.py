"""Learning-rate schedulers with MXNet 1.9's ``mxnet.lr_scheduler`` behaviour.

MXNet's schedulers are stateful (``FactorScheduler`` lowers ``base_lr`` in place as
``num_update`` grows), so a spec carries that state too: a scheduler rebuilt from
``to_spec()`` continues exactly where the original was.

    sched = scheduler_from_spec({"name": "factor", "params": {"step": 100, "factor": 0.5}})
    lr = sched(num_update)
"""
from __future__ import annotations

import logging
import math
from typing import Any

logger = logging.getLogger(__name__)

SCHEDULERS: dict[str, type[LRScheduler]] = {}


def _register(name: str):
    def deco(cls: type[LRScheduler]) -> type[LRScheduler]:
        SCHEDULERS[name] = cls
        cls.spec_name = name
        return cls
    return deco


class LRScheduler:
    """Warmup shared by every scheduler (MXNet ``LRScheduler``).

    ``warmup_final_lr`` is a separate field because MXNet fixes it at construction:
    an optimizer that later overrides ``base_lr`` does not change the warmup target.
    """

    spec_name = ""

    def __init__(self, base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0,
                 warmup_mode: str = "linear", warmup_final_lr: float | None = None):
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.warmup_final_lr = self.base_lr if warmup_final_lr is None else float(warmup_final_lr)
        self.warmup_begin_lr = float(warmup_begin_lr)
        if self.warmup_begin_lr > self.warmup_final_lr:
            raise ValueError("Base lr has to be higher than warmup_begin_lr")
        if self.warmup_steps < 0:
            raise ValueError("Warmup steps has to be positive or 0")
        if warmup_mode not in ("linear", "constant"):
            raise ValueError("Supports only linear and constant modes of warmup")
        self.warmup_mode = warmup_mode

    def get_warmup_lr(self, num_update: int) -> float:
        if self.warmup_mode == "linear":
            increase = (self.warmup_final_lr - self.warmup_begin_lr) \
                * float(num_update) / float(self.warmup_steps)
            return self.warmup_begin_lr + increase
        return self.warmup_begin_lr

    def __call__(self, num_update: int) -> float:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {"base_lr": self.base_lr, "warmup_steps": self.warmup_steps,
                "warmup_begin_lr": self.warmup_begin_lr, "warmup_mode": self.warmup_mode,
                "warmup_final_lr": self.warmup_final_lr}

    def to_spec(self) -> dict[str, Any]:
        """A msgpack-able description, including the scheduler's current state."""
        return {"name": self.spec_name, "params": self._params()}


@_register("factor")
class FactorScheduler(LRScheduler):
    """``base_lr * factor ** floor(num_update / step)``, floored at ``stop_factor_lr``."""

    def __init__(self, step: int, factor: float = 1, stop_factor_lr: float = 1e-8,
                 count: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        if step < 1:
            raise ValueError("Schedule step must be greater or equal than 1 round")
        if factor > 1.0:
            raise ValueError("Factor must be no more than 1 to make lr reduce")
        self.step = int(step)
        self.factor = float(factor)
        self.stop_factor_lr = float(stop_factor_lr)
        self.count = int(count)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while num_update > self.count + self.step:
            self.count += self.step
            self.base_lr *= self.factor
            self.base_lr = max(self.base_lr, self.stop_factor_lr)
            logger.debug("update %d: learning rate now %.5e", num_update, self.base_lr)
        return self.base_lr

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "step": self.step, "factor": self.factor,
                "stop_factor_lr": self.stop_factor_lr, "count": self.count}


@_register("multifactor")
class MultiFactorScheduler(LRScheduler):
    """Multiply ``base_lr`` by ``factor`` each time ``num_update`` passes a step in ``step``."""

    def __init__(self, step: list[int], factor: float = 1, cur_step_ind: int = 0, count: int = 0,
                 **kwargs: Any):
        super().__init__(**kwargs)
        step = [int(s) for s in step]
        if not step:
            raise ValueError("step must be a non-empty list")
        for i, s in enumerate(step):
            if i and s <= step[i - 1]:
                raise ValueError("Schedule step must be an increasing integer list")
            if s < 1:
                raise ValueError("Schedule step must be greater or equal than 1 round")
        if factor > 1.0:
            raise ValueError("Factor must be no more than 1 to make lr reduce")
        self.step = step
        self.factor = float(factor)
        self.cur_step_ind = int(cur_step_ind)
        self.count = int(count)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while self.cur_step_ind < len(self.step) and num_update > self.step[self.cur_step_ind]:
            self.count = self.step[self.cur_step_ind]
            self.cur_step_ind += 1
            self.base_lr *= self.factor
            logger.debug("update %d: learning rate now %.5e", num_update, self.base_lr)
        return self.base_lr

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "step": list(self.step), "factor": self.factor,
                "cur_step_ind": self.cur_step_ind, "count": self.count}


class _DecayToFinal(LRScheduler):
    """Shared by poly and cosine: decay from ``base_lr_orig`` to ``final_lr`` over ``max_update``.

    ``base_lr_orig`` is fixed at construction as in MXNet, so an optimizer's
    ``learning_rate`` override of ``base_lr`` has no effect once decay starts.
    """

    def __init__(self, max_update: int, final_lr: float = 0, base_lr_orig: float | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if int(max_update) < 1:
            raise ValueError("maximum number of updates must be strictly positive")
        self.max_update = int(max_update)
        self.final_lr = float(final_lr)
        self.base_lr_orig = self.base_lr if base_lr_orig is None else float(base_lr_orig)
        self.max_steps = self.max_update - self.warmup_steps

    def _decay(self, steps: int) -> float:
        raise NotImplementedError

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            self.base_lr = self.final_lr + (self.base_lr_orig - self.final_lr) * \
                self._decay(num_update - self.warmup_steps)
        return self.base_lr

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "max_update": self.max_update, "final_lr": self.final_lr,
                "base_lr_orig": self.base_lr_orig}


@_register("poly")
class PolyScheduler(_DecayToFinal):
    """``final_lr + (base_lr - final_lr) * (1 - nup / max_nup) ** pwr`` after warmup."""

    def __init__(self, max_update: int, pwr: float = 2, **kwargs: Any):
        super().__init__(max_update, **kwargs)
        self.power = pwr

    def _decay(self, steps: int) -> float:
        return pow(1 - float(steps) / float(self.max_steps), self.power)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "pwr": self.power}


@_register("cosine")
class CosineScheduler(_DecayToFinal):
    """``final_lr + (base_lr - final_lr) * (1 + cos(pi * nup / max_nup)) / 2`` after warmup."""

    def _decay(self, steps: int) -> float:
        return (1 + math.cos(math.pi * steps / self.max_steps)) / 2


def scheduler_from_spec(spec: Any) -> LRScheduler | None:
    """Build a scheduler from its spec; ``None`` stays ``None`` and an instance passes through.

    Raises
    ------
    ValueError
        The spec is malformed or names a scheduler ps does not know.

    Example::

        scheduler_from_spec({"name": "cosine", "params": {"max_update": 1000, "base_lr": 0.1}})
    """
    if spec is None or isinstance(spec, LRScheduler):
        return spec
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"an lr_scheduler spec is a dict with a 'name', not {spec!r:.200}")  # noqa: TRY004
    cls = SCHEDULERS.get(spec["name"].lower())
    if cls is None:
        raise ValueError(f"unknown lr_scheduler {spec['name']!r}; ps knows: {', '.join(sorted(SCHEDULERS))}")
    return cls(**spec.get("params", {}))
