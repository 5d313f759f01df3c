"""Horovod's layer, below both framework adapters (``ps.torch``, ``ps.mxnet``'s Horovod calls),
so that each is written once: the job this process is in (``job``), what its keys are called
(``names``), the collectives made of sums (``ops``), process sets, the objects its collectives
carry, and the rendezvous a bare ``mpirun`` needs (``selfstart``). Nothing of the core imports
it: it is built on the public ``KVStore``, as the adapters are.

The names the adapters import are re-exported here, so that an adapter asks the layer, not
the module that happens to hold a name today.
"""
from __future__ import annotations

from .job import Job, absent, nccl_built, predivide_factor, verified
from .names import tensor_key, timeline_bar, variant
from .ops import GATHERED, Adasum, Average, Max, Min, Product, ReduceOp, Sum, fingerprint, reduce_op

__all__ = ["GATHERED", "Adasum", "Average", "Job", "Max", "Min", "Product", "ReduceOp", "Sum", "absent", "fingerprint",
           "nccl_built", "predivide_factor", "reduce_op", "tensor_key", "timeline_bar", "variant", "verified"]
