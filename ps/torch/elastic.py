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
        """Horovod runs the callbacks after a reset; ps's workers never change, so nothing here
        calls it, but a script may."""
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


def _copy(value: Any) -> Any:
    """A saved attribute: a deep copy where one can be made (so a commit is not changed by
    the steps after it); otherwise the value itself, as Horovod keeps every attribute (a
    tensor still in an autograd graph cannot be deep-copied)."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - any value a script may keep
        return value


class ObjectState(State):
    """Plain attributes (``epoch=0, batch=0``): copied on ``save``, rank 0's on ``sync``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._set(kwargs)
        self._saved = {k: _copy(v) for k, v in kwargs.items()}

    def _current(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def _set(self, values: dict[str, Any]) -> None:
        self._names = tuple(values)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def save(self) -> None:
        self._saved = {k: _copy(v) for k, v in self._current().items()}

    def restore(self) -> None:
        self._set({k: _copy(v) for k, v in self._saved.items()})

    def sync(self) -> None:
        if self._names:
            self._set(broadcast_object(self._current(), root_rank=0, name="elastic.state"))
            self.save()


class _Tracked:
    """A model, optimizer or ElasticSampler of a TorchState: saved, restored and synced
    through its ``state_dict``, so the object a script holds stays the one it trains."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.obj.state_dict())

    def restore(self) -> None:
        # a copy: an optimizer keeps the tensors it loads, and its next step would change the commit
        self.obj.load_state_dict(copy.deepcopy(self.saved))

    def sync(self, name: str) -> None:
        if isinstance(self.obj, torch.nn.Module):
            broadcast_parameters(self.obj.state_dict(), root_rank=0)
        elif isinstance(self.obj, torch.optim.Optimizer):
            broadcast_optimizer_state(self.obj, root_rank=0)
        else:
            self.obj.load_state_dict(broadcast_object(self.obj.state_dict(), root_rank=0, name=f"elastic.{name}"))
        self.save()


def _trackable(value: Any) -> bool:
    return isinstance(value, (torch.nn.Module, torch.optim.Optimizer, ElasticSampler))


class TorchState(ObjectState):
    """``hvd.elastic.TorchState(model, optimizer, **attributes)``: models, optimizers and
    ElasticSamplers (as ``model``/``optimizer`` or as attributes: a GAN's two of each) are
    kept through their ``state_dict``; other attributes are plain values."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        objects = {k: v for k, v in {"model": model, "optimizer": optimizer, **kwargs}.items() if _trackable(v)}
        super().__init__(**{k: v for k, v in kwargs.items() if k not in objects})
        object.__setattr__(self, "_tracked", {k: _Tracked(v) for k, v in objects.items()})
        for name, value in {"model": model, "optimizer": optimizer, **objects}.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        """A new model, optimizer or sampler in a tracked place is tracked from now on (its
        current state is the one a ``restore()`` before the next commit brings back)."""
        tracked = getattr(self, "_tracked", None)
        if tracked is not None and (name in tracked or (name in ("model", "optimizer") and _trackable(value))):
            tracked[name] = _Tracked(value)
        object.__setattr__(self, name, value)

    def save(self) -> None:
        super().save()
        for t in self._tracked.values():
            t.save()

    def restore(self) -> None:
        super().restore()
        for t in self._tracked.values():
            t.restore()

    def sync(self) -> None:
        # models first: a fresh optimizer's state is made on them (broadcast_optimizer_state)
        order = sorted(self._tracked.items(), key=lambda item: not isinstance(item[1].obj, torch.nn.Module))
        for name, t in order:
            t.sync(name)
        super().sync()


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
        """Recompute this worker's share from the epoch and the samples processed so far."""
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
