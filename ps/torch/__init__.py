"""Horovod's PyTorch API on ps's parameter servers: change ``import horovod.torch as hvd``
to ``import ps.torch as hvd`` and launch with ``python -m ps.launch -n N -s S python train.py``.

Gradients are summed by the servers (sync rounds, no optimizer there) and averaged here, so a
job of N workers makes the updates one process makes on the N batches together; the local
``torch.optim`` optimizer steps as under Horovod. docs/torch.md has the call-by-call table.
"""
from .compression import Compression
from .ops import (Average, Sum, allreduce, allreduce_, allreduce_async, broadcast, broadcast_object,
                  broadcast_optimizer_state, broadcast_parameters, poll, synchronize)
from .optimizer import DistributedOptimizer
from .server_optimizer import ServerOptimizer
from .runtime import init, is_initialized, join, local_rank, local_size, rank, shutdown, size

__all__ = ["Average", "Sum", "Compression", "DistributedOptimizer", "allreduce", "allreduce_", "allreduce_async",
           "broadcast", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
           "ServerOptimizer", "init", "is_initialized", "join", "local_rank", "local_size", "poll", "rank", "shutdown",
           "size", "synchronize"]
