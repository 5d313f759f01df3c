"""Horovod's layer, below both framework adapters (``ps.torch``, ``ps.mxnet``'s Horovod calls):
the job this process is in, its process sets, the objects and the timeline its collectives
carry, and the rendezvous a bare ``mpirun`` needs. Nothing of the core imports it: it is built
on the public ``KVStore``, as the adapters are.

The names the adapters import are re-exported here, so that an adapter asks the layer, not
the module that happens to hold a name today.
"""
from __future__ import annotations

from .job import (GATHERED, Adasum, Average, Job, Max, Min, Product, ReduceOp, Sum, absent, fingerprint, nccl_built,
                  predivide_factor, reduce_op, tensor_key, timeline_bar, verified)

__all__ = ["GATHERED", "Adasum", "Average", "Job", "Max", "Min", "Product", "ReduceOp", "Sum", "absent", "fingerprint",
           "nccl_built", "predivide_factor", "reduce_op", "tensor_key", "timeline_bar", "verified"]
