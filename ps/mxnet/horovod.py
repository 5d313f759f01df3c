"""Horovod's MXNet calls on ps: ``import ps.mxnet as hvd`` runs the Horovod-MXNet template
(``hvd.DistributedOptimizer`` around an ``mx.optimizer``, ``gluon.Trainer(..., kvstore=None)``).

The workers' gradients are averaged through the servers (one key per parameter index, summed
in sync rounds, no optimizer there) before the wrapped optimizer updates the local weights,
so N workers make one process's update on the N batches together. ``hvd.DistributedTrainer``
(one per network, ``prefix=`` apart) does the same inside a ``gluon.Trainer``. Uses its own numpy
``ps.KVStore``: do not also create an MXNet ``dist_*`` kvstore in the same process.
"""
from __future__ import annotations

import types
from typing import Any

import mxnet as mx
import numpy as np

from ..collective import absent, predivide_factor
from ..collective.process_sets import check_root
from .collectives import broadcast_values, job, sets, sums

# What this build has (hvd.mpi_built(), ...): ps has none of Horovod's MPI, Gloo, NCCL, ...
mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = absent
ddl_built = ccl_built = cuda_built = rocm_built = absent


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job named by the ``DMLC_*`` variables (alone, size 1, without them), then
    register ``process_sets`` in order (a list of ProcessSets or rank lists, or "dynamic").
    ``comm`` (an MPI communicator in Horovod) is not supported."""
    if comm is not None:
        raise ValueError("ps.mxnet.init(comm=...) is not supported: ps forms its cluster from the DMLC_* "
                         "variables (python -m ps.launch sets them)")
    job.init("dist_sync")
    sets.register(process_sets)


def shutdown() -> None:
    """Leave the job (its store closes); every process set but the global one is gone;
    ``init()`` may join again."""
    job.shutdown()
    sets.clear()


# Horovod's process sets (ps/collective/process_sets.py): collectives among some of the workers
global_process_set = sets.global_set
add_process_set = sets.add
remove_process_set = sets.remove
process_set_by_id = sets.by_id


# Who this process is: the job's own calls, bound as Horovod binds its basics' (before init()
# they raise the job's ValueError)
is_initialized = job.is_initialized
rank = job.rank
size = job.size
local_rank = job.local_rank
local_size = job.local_size
cross_rank = job.cross_rank
cross_size = job.cross_size

# Horovod's timeline: rank 0 writes a chrome://tracing file of its collectives (ps/collective/timeline.py)
start_timeline = job.start_timeline
stop_timeline = job.stop_timeline


class NoneCompressor:
    """Send gradients as they are."""

    wire_dtype: Any = None

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Horovod's Compressor interface: the tensor to send, and what ``decompress`` needs."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor:
    """Send floating-point gradients as float16: half the bytes each way. The servers sum
    in float16, as Horovod's allreduce of the compressed tensor does."""

    wire_dtype: Any = np.float16

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """A floating-point NDArray as float16 (and its dtype, to go back to); others as they are."""
        if np.dtype(tensor.dtype).kind == "f":
            return tensor.astype(np.float16, copy=False), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor.astype(ctx, copy=False) if ctx is not None else tensor


class Compression:
    """Horovod's ``hvd.Compression.none`` / ``.fp16`` for ``DistributedTrainer``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def _average(names: list[str], grads: list[np.ndarray], compression: Any = NoneCompressor,
             predivide: float = 1.0, process_set: Any = None) -> list[np.ndarray]:
    """Each gradient's mean over the workers (of ``process_set``): divided by ``predivide``
    before the sum and multiplied by ``predivide / size`` after it (Horovod's
    gradient_predivide_factor, which keeps float16 sums in range), sent as ``compression``
    says. A worker outside ``process_set`` keeps its own gradients, as under Horovod."""
    if sets.outside(process_set):
        return grads
    where = sets.scope(process_set)
    sends = []
    for g in grads:
        wire = compression.wire_dtype if compression.wire_dtype is not None and g.dtype.kind == "f" else g.dtype
        sends.append((g / predivide if predivide != 1.0 else g).astype(wire, copy=False))
    return [(total * (predivide / where.size)).astype(g.dtype, copy=False)
            for g, total in zip(grads, sums(names, sends, where))]


def _checked(compression: Any, predivide: Any) -> tuple[Any, float]:
    compression = NoneCompressor if compression is None else compression
    if compression not in (NoneCompressor, FP16Compressor):
        raise ValueError(f"compression={compression!r}: ps.mxnet has hvd.Compression.none and hvd.Compression.fp16")
    return compression, predivide_factor(predivide)


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None) -> None:
    """Overwrite ``params`` (a Gluon ``ParameterDict``, or a dict of NDArrays such as
    ``Module.get_params()[0]``) with rank ``root_rank``'s values, in place. A Gluon parameter
    not initialized yet (deferred: its input size comes with the first forward pass) is
    broadcast right after it is initialized, as Horovod does; every worker initializes it at
    the same point of the same script, so the broadcast meets on every worker. ``prefix``
    keeps the names of two calls apart, as in Horovod."""
    if job.store() is None:
        return
    check_root(root_rank, sets.scope(), "broadcast_parameters")    # before any parameter waits for it
    items, values = [], []
    for name, p in sorted(params.items()):
        name = f"{prefix or ''}{name}"
        if isinstance(p, mx.gluon.Parameter):
            try:
                values.append(p.data().asnumpy())
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_once_initialized(p, name, root_rank)
                continue
        else:
            values.append(p.asnumpy())
        items.append((name, p))
    got = broadcast_values([f"hvd.broadcast.{n}" for n, _ in items], values, root_rank, "broadcast_parameters")
    for (_, p), value in zip(items, got):
        if isinstance(p, mx.gluon.Parameter):
            p.set_data(mx.nd.array(value, dtype=value.dtype))
        else:
            p[:] = value


def _broadcast_once_initialized(param: Any, name: str, root_rank: int) -> None:
    """Wrap the parameter's own initialization (MXNet's ``_init_impl``, which its deferred
    initialization calls once the shape is known) with the broadcast."""
    init_impl = param._init_impl

    def init_then_broadcast(self: Any, *args: Any, **kwargs: Any) -> None:
        init_impl(*args, **kwargs)
        (got,) = broadcast_values([f"hvd.broadcast.{name}"], [self.list_data()[0].asnumpy()], root_rank,
                                  f"broadcast of parameter {name!r}")
        with mx.autograd.pause():           # the first forward pass may be recording
            for arr in self.list_data():
                arr[:] = got

    param._init_impl = types.MethodType(init_then_broadcast, param)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Averages each gradient over the workers, then lets ``optimizer`` update the weight.
    Every other attribute (lr, rescale_grad, which ``Trainer.step`` sets, states) is the
    wrapped optimizer's."""

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: Any = None):
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mx.optimizer.Optimizer, got {type(optimizer).__name__}")
        _, predivide = _checked(None, gradient_predivide_factor)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide", predivide)
        object.__setattr__(self, "_process_set", process_set)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_optimizer"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._optimizer, name, value)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def _average(self, index: Any, grad: Any) -> None:
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        if size() == 1:
            return
        means = _average([f"hvd.grad.{i}" for i in indices], [g.asnumpy() for g in grads],
                         predivide=self._predivide, process_set=self._process_set)
        for g, mean in zip(grads, means):
            g[:] = mean

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._average(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._average(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """Horovod's ``hvd.DistributedTrainer``: a ``gluon.Trainer`` without a kvstore whose
    ``step`` first averages every gradient over the workers. One per network works (a GAN's
    generator and discriminator): ``prefix`` keeps their gradients' names apart, which a
    ``dist_*`` kvstore cannot (a Trainer numbers its parameters from 0)."""

    def __init__(self, params: Any, optimizer: Any, optimizer_params: Any = None, compression: Any = NoneCompressor,
                 gradient_predivide_factor: float = 1.0, prefix: str | None = None, num_groups: int = 0,
                 process_set: Any = None):
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("DistributedTrainer averages the gradients itself: give it the optimizer, "
                            "not a DistributedOptimizer")
        self._ps_compression, self._ps_predivide = _checked(compression, gradient_predivide_factor)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._ps_prefix = f"hvd.trainer.{prefix or ''}."
        self._ps_process_set = process_set
        self._ps_params = list(params.values()) if hasattr(params, "values") else list(params)
        job.store()                                    # hvd.init() first, as in Horovod

    def _allreduce_grads(self) -> None:
        if size() == 1:
            return
        live = [(i, p) for i, p in enumerate(self._ps_params) if p.grad_req != "null"]
        grads = [p.list_grad() for _, p in live]
        for (_, p), gs in zip(live, grads):
            if gs[0].stype != "default":
                raise ValueError(f"parameter {p.name!r} has a {gs[0].stype} gradient: DistributedTrainer "
                                 "averages dense gradients only (use kvstore='dist_sync' for sparse ones)")
        means = _average([f"{self._ps_prefix}{i}" for i, _ in live], [sum(g.asnumpy() for g in gs) for gs in grads],
                         self._ps_compression, self._ps_predivide, self._ps_process_set)
        for gs, mean in zip(grads, means):
            for g in gs:
                g[:] = mean
