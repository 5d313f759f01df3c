"""Cross-barrier (``DistributedOptimizer(..., model=net)``): the next forward pass waits per
module, not ``step()`` for every gradient.

Horovod's and DDP's ``step()`` waits for the last gradient's sum, so the next forward pass
cannot start while the last layers' sums (the first layers' gradients are ready last) are on
the wire. Here ``step()`` returns once every gradient is on its way; a forward pre-hook on
each module that holds parameters waits for just those parameters' sums and runs the
optimizer's update on them, with the hyper-parameters ``step()`` saw. The first layers' sums
are sent first (their priority), so the forward pass rarely waits at all.

The update of a parameter is then the same arithmetic on the same gradient as the optimizer's
own step, so the numbers equal ``DistributedOptimizer``'s for optimizers that update each
parameter on its own (the ones in :data:`PER_PARAMETER`); others are refused. What must see
every sum at once keeps working: ``synchronize()`` (then clipping, then ``step()`` under
``skip_synchronize()``) and ``step(closure)`` take the waiting path; ``state_dict()`` of the
model or optimizer and ``finish_updates()`` complete the updates first.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

# torch's optimizers whose step updates each parameter from its own gradient and state only
PER_PARAMETER = tuple(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop")
    if hasattr(torch.optim, name))


class CrossBarrier:
    """The per-module waits of one optimizer on one model. ``land(params)`` waits for the sums
    of ``params`` and puts them into their gradients; ``update(params, groups)`` runs the
    optimizer's own step on ``params`` alone with ``groups``' hyper-parameters."""

    def __init__(self, model: torch.nn.Module, names: dict[torch.Tensor, str], optimizer: torch.optim.Optimizer,
                 land: Callable[[list[torch.Tensor]], None],
                 update: Callable[[list[torch.Tensor], list[dict]], None],
                 arrived: Callable[[torch.Tensor], bool]) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"DistributedOptimizer(model=...) takes the torch.nn.Module being trained, "
                            f"got {type(model).__name__}")
        if hasattr(model, "_orig_mod"):
            raise ValueError("DistributedOptimizer(model=...) with a torch.compile'd model: a compiled graph "
                             "does not run the per-module waits; pass model=None (step() then waits)")
        if not isinstance(optimizer, PER_PARAMETER):
            raise ValueError(f"DistributedOptimizer(model=...) updates parameters module by module, which is only "
                             f"the same as one step for optimizers that update each parameter on its own "
                             f"({', '.join(c.__name__ for c in PER_PARAMETER)}); {type(optimizer).__name__} "
                             "is not one of them: pass model=None")
        self._land, self._update, self._arrived = land, update, arrived
        self._pending: dict[torch.Tensor, tuple[torch.Tensor, int]] = {}   # param -> (its gradient, groups index)
        self._groups: list[list[dict]] = []          # hyper-parameters of each step() with updates pending
        self._names = names
        holders = [(module, mine) for module in model.modules()
                   if (mine := [p for p in module.parameters(recurse=False) if p in names])]
        owned = {p for _, mine in holders for p in mine}
        missing = [n for p, n in names.items() if p not in owned]
        if missing:
            raise ValueError(f"DistributedOptimizer(model=...): the optimizer's parameters {missing[:5]} are not "
                             "parameters of that model; pass the model they belong to")
        self._hooks = [module.register_forward_pre_hook(self._before(mine)) for module, mine in holders]
        self._hooks.append(model.register_state_dict_pre_hook(lambda *args: self.finish()))

    def _before(self, params: list[torch.Tensor]):
        """The module's own parameters, and with them the next ones (in the order their sums
        were asked for, first layers first) whose sums are already back: one optimizer call
        for many parameters costs less than one each (same arithmetic). The scan stops at
        the first sum still on its way, so a forward pass costs O(parameters), not O(P²)."""
        def hook(_module: torch.nn.Module, _inputs: Any) -> None:
            mine = [p for p in params if p in self._pending]
            if not mine:
                return
            chosen = set(mine)
            for p in self._pending:
                if p not in chosen:
                    if not self._arrived(p):
                        break
                    mine.append(p)
            self.finish(mine)
        return hook

    def defer(self, params: list[torch.Tensor], groups: list[dict]) -> None:
        """``step()``: the updates of ``params`` (in the order their sums come back) wait for
        their module's next forward."""
        self._groups.append(groups)
        for p in params:
            self._pending[p] = (p.grad, len(self._groups) - 1)

    def name_stale(self, p: torch.Tensor) -> None:
        """A new gradient of a parameter whose update has not run: the forward pass read it
        outside its module's forward (a functional use from another module), before the update."""
        if p in self._pending:
            raise RuntimeError(f"parameter {self._names[p]!r} got a new gradient before its update from the last "
                               "step() ran: the forward pass used it outside the forward of the module that holds "
                               "it, so DistributedOptimizer(model=...) could not wait for it (the step read its old "
                               "value). Call optimizer.finish_updates() before that use, or pass model=None")

    def finish(self, params: list[torch.Tensor] | None = None) -> None:
        """Land and apply the pending updates of ``params`` (None: all), step by step in order."""
        chosen = list(self._pending) if params is None else params
        if not chosen:
            return
        current = {p: p.grad for p in chosen}
        try:
            for p in chosen:
                p.grad = self._pending[p][0]         # the gradient sent, also after zero_grad(set_to_none)
            self._land(chosen)                       # its sum, into it
            by_step: dict[int, list[torch.Tensor]] = {}
            for p in chosen:
                by_step.setdefault(self._pending[p][1], []).append(p)
            for step in sorted(by_step):
                self._update(by_step[step], self._groups[step])
        finally:
            for p in chosen:
                p.grad = current[p]
                del self._pending[p]
        if not self._pending:
            self._groups.clear()
