"""Horovod's PyTorch API on ps's parameter servers: change ``import horovod.torch as hvd``
to ``import ps.torch as hvd`` and launch with ``python -m ps.launch -n N -s S python train.py``.

Gradients are summed by the servers (sync rounds, no optimizer there) and averaged here, so a
job of N workers makes the updates one process makes on the N batches together; the local
``torch.optim`` optimizer steps as under Horovod. docs/torch.md has the call-by-call table.
"""
import importlib

from ..collective import nccl_built
from ..errors import CollectiveError as HorovodInternalError
from . import elastic
from .compression import Compression, Compressor
from .gather import (allgather, allgather_async, allgather_object, alltoall, alltoall_async, grouped_allgather,
                     grouped_allgather_async, grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                     reducescatter_async, sparse_allreduce_async)
from .ops import (Adasum, Average, Max, Min, Product, Sum, allreduce, allreduce_, allreduce_async, allreduce_async_,
                  broadcast, broadcast_, broadcast_async, broadcast_async_, broadcast_object,
                  broadcast_optimizer_state, broadcast_parameters, grouped_allreduce, grouped_allreduce_,
                  grouped_allreduce_async, grouped_allreduce_async_, poll, synchronize)
from .optimizer import DistributedOptimizer
from .process_sets import (ProcessSet, add_process_set, barrier, global_process_set, init, process_set_by_id,
                           remove_process_set, shutdown)
from .server_optimizer import ServerOptimizer
from .sync_batch_norm import SyncBatchNorm
from .runtime import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                      is_homogeneous, is_initialized, join, local_rank, local_size, mpi_built, mpi_enabled,
                      mpi_threads_supported, rank, rocm_built, size, start_timeline, stop_timeline)

__all__ = ["Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer", "Embedding", "EmbeddingBag", "EmbeddingBagCollection", "HorovodInternalError", "Max",
           "Min", "ProcessSet", "Product",
           "ServerOptimizer", "Sum", "SyncBatchNorm", "add_process_set", "allgather", "allgather_async", "allgather_object",
           "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
           "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank", "cross_size", "cuda_built",
           "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
           "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init",
           "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "nccl_built", "poll", "process_set_by_id", "rank", "reducescatter", "reducescatter_async",
           "remove_process_set", "rocm_built", "shutdown", "size", "sparse_allreduce_async", "start_timeline",
           "stop_timeline", "synchronize"]

# ps.torch.embedding needs torch.compiler.disable, whose first use imports torch._dynamo: a
# second of CPU at every `import ps.torch`, which a script without PS-held tables never needs
_EMBEDDING = ("Embedding", "EmbeddingBag", "EmbeddingBagCollection")


def __getattr__(name):
    if name in _EMBEDDING or name == "embedding":
        embedding = importlib.import_module(f"{__name__}.embedding")
        return embedding if name == "embedding" else getattr(embedding, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
