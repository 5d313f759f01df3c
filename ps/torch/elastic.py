"""Horovod's ``hvd.elastic`` (``run``, ``TorchState``, ``ElasticSampler``) on a fixed set of
workers, so that a Horovod elastic script runs on ps unchanged.

Horovod's elastic mode lets survivors of a dead worker roll back to the last ``commit()``,
re-form with fewer or new workers and go on. ps keeps the workers a job started with: its
sync rounds and keys belong to them, and a restarted worker cannot rejoin a Horovod-style job
(its model lives on the workers; ``collective.Job.init`` says so). What carries over is what
an elastic script relies on at its start and in every step: ``run`` brings every worker to
rank 0's state before the training function, ``commit``/``restore`` keep and bring back an
in-memory copy, and ``ElasticSampler`` gives each worker its share of the data and resumes an
epoch where a restored state says. A worker that dies ends the job as without ``elastic``
(a dead server is recovered); nothing here pretends otherwise.
"""
from __future__ import annotations

import copy
import functools
import math
import random
from typing import Any, Callable

import torch

from . import runtime
from .ops import broadcast_object, broadcast_optimizer_state, broadcast_parameters


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """``@hvd.elastic.run``: ``func(state, ...)`` runs once every worker holds rank 0's
    ``state`` (``state.sync()``). Horovod would catch a dead peer's error, restore the last
    commit and run ``func`` again with the workers left; here that error ends the job."""
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)
    return wrapper


class State:
    """What an elastic script keeps: ``commit()`` saves it, ``restore()`` brings the saved copy
    back, ``sync()`` gives every worker rank 0's."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Horovod calls these after the workers changed; under ps they never change."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises here when hosts were added or removed; ps's workers are fixed."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (``epoch=0, batch=0``): copied on ``save``, rank 0's on ``sync``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._attrs = dict(kwargs)
        self._saved = copy.deepcopy(self._attrs)
        for name, value in kwargs.items():
            object.__setattr__(self, name, value)

    def _current(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._attrs}

    def save(self) -> None:
        self._attrs = self._current()
        self._saved = copy.deepcopy(self._attrs)

    def restore(self) -> None:
        self._attrs = copy.deepcopy(self._saved)
        for name, value in self._attrs.items():
            object.__setattr__(self, name, value)

    def sync(self) -> None:
        if self._attrs:
            self._attrs = broadcast_object(self._current(), root_rank=0, name="elastic.state")
            for name, value in self._attrs.items():
                object.__setattr__(self, name, value)
            self._saved = copy.deepcopy(self._attrs)


class TorchState(ObjectState):
    """``hvd.elastic.TorchState(model, optimizer, **attributes)``: the model's and the
    optimizer's state, ElasticSamplers given as attributes, and plain attributes."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        super().__init__(**{k: v for k, v in kwargs.items() if k not in samplers})
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "_samplers", samplers)
        for name, sampler in samplers.items():
            object.__setattr__(self, name, sampler)
        self._save_torch()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in getattr(self, "_samplers", {}):
            self._samplers[name] = value
        object.__setattr__(self, name, value)

    def _save_torch(self) -> None:
        object.__setattr__(self, "_model_saved",
                           None if self.model is None else copy.deepcopy(self.model.state_dict()))
        object.__setattr__(self, "_optimizer_saved",
                           None if self.optimizer is None else copy.deepcopy(self.optimizer.state_dict()))
        object.__setattr__(self, "_samplers_saved", {k: s.state_dict() for k, s in self._samplers.items()})

    def save(self) -> None:
        super().save()
        self._save_torch()

    def restore(self) -> None:
        super().restore()
        if self.model is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._optimizer_saved)
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._samplers_saved[name])

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0, model=self.model)
        if self._samplers:
            got = broadcast_object({k: s.state_dict() for k, s in self._samplers.items()}, root_rank=0,
                                   name="elastic.samplers")
            for name, sampler in self._samplers.items():
                sampler.load_state_dict(got[name])
        super().sync()
        self._save_torch()


class ElasticSampler(torch.utils.data.Sampler):
    """Each worker's share of ``dataset`` (shuffled by ``seed + epoch``, the same order on
    every worker), skipping the samples already processed this epoch (``record_batch``), so a
    restored state resumes mid-epoch. Call ``set_epoch`` at an epoch's end."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One batch of ``batch_size`` done on every worker."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.processed_num = state["epoch"], state["processed_num"]
        self.reset()

    def reset(self) -> None:
        self.num_replicas, self.rank = runtime.size(), runtime.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Any:
        left = self.remaining_indices      # padded by repeating it, so every worker gets num_samples
        padded = [left[i % len(left)] for i in range(self.total_size)] if left else []
        return iter(padded[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticSampler", "TorchState", "run"]
