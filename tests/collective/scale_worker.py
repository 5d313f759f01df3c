"""Every allreduce op (Sum, Average, Min, Max, Product) on an int32 and a float32 tensor, with
prescale and postscale factors, through the adapter named on the command line ("torch" for
``ps.torch``, "mxnet" for ``ps.mxnet``); prints one RESULT line of JSON that
test_scale_factors.py checks against Horovod's rule and against the other adapter."""
import json
import sys

import numpy as np

FACTORS = [(0.5, 3.0), (0.1, 0.7)]          # (prescale, postscale)
OPS = ("Sum", "Average", "Min", "Max", "Product")
DTYPES = ("int32", "float32")


def values(rank, dtype):
    """Rank ``rank``'s tensor: halves to truncate, negatives, and an integer that float32
    cannot hold (2**24 + 1 after the prescale of 0.5)."""
    return np.array([7 + 2 * rank, -7 - 3 * rank, 3, 33554434 if rank == 0 else 2, 1 + rank], dtype)


def adapter(name):
    """(hvd, allreduce of a numpy array returning a numpy array) of ``name``."""
    if name == "torch":
        import torch

        import ps.torch as hvd

        def allreduce(a, op, key, pre, post):
            return hvd.allreduce(torch.from_numpy(a), name=key, op=op, prescale_factor=pre,
                                 postscale_factor=post).numpy()
    else:
        import ps.mxnet as hvd      # before mxnet, as an MXNet script imports it
        import mxnet as mx

        def allreduce(a, op, key, pre, post):
            return hvd.allreduce(mx.nd.array(a, dtype=a.dtype), name=key, op=op, prescale_factor=pre,
                                 postscale_factor=post).asnumpy()
    return hvd, allreduce


def main():
    hvd, allreduce = adapter(sys.argv[1])
    hvd.init()
    r = hvd.rank()
    out = {"rank": r, "size": hvd.size()}
    for i, (pre, post) in enumerate(FACTORS):
        for dtype in DTYPES:
            for op in OPS:
                got = allreduce(values(r, dtype), getattr(hvd, op), f"{op}.{dtype}.{i}", pre, post)
                out[f"{op} {dtype} {pre} {post}"] = [got.dtype.name, got.tolist()]
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
