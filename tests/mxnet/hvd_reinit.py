"""``hvd.init()`` after ``hvd.shutdown()`` in ps.mxnet joins again, as Horovod allows: three
sessions in one process, each with numbers of its own (a sum left over from an earlier one
would show), a DistributedOptimizer step included; one RESULT line for test_horovod_mxnet.py."""
import json
import os

import mxnet as mx

import ps.mxnet as hvd


def session(i, out):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out["who"].append([r, n, hvd.is_initialized()])
    out["sum"].append(hvd.allreduce(mx.nd.array([float(r + 1) * (i + 1)]), average=False, name="x").asnumpy().tolist())
    out["bcast"].append(hvd.broadcast(mx.nd.array([10.0 * r + i]), root_rank=i % n, name="b").asnumpy().tolist())
    out["gather"].append(hvd.allgather(mx.nd.ones((r + 1, 1)) * i, name="g").asnumpy().reshape(-1).tolist())
    w = mx.nd.zeros((2,))
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0))
    opt.update(0, w, mx.nd.ones((2,)) * float(r + 1) * (i + 1), opt.create_state(0, w))
    out["step"].append(w.asnumpy().tolist())           # minus the average gradient
    hvd.shutdown()
    out["after"].append(hvd.is_initialized())


def main():
    out = {k: [] for k in ("who", "sum", "bcast", "gather", "step", "after")}
    for i in range(3):
        session(i, out)
    os.write(1, f"RESULT {json.dumps(out)}\n".encode())      # one write: mpirun interleaves prints


if __name__ == "__main__":
    main()
