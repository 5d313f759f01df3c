"""Horovod-MXNet's collectives on ps (``import ps.mxnet as hvd``), run by each of 3 workers:
prints one RESULT line of what came back, which test_horovod_mxnet.py checks against numpy."""
import json
import sys

import mxnet as mx
import numpy as np

import ps.mxnet as hvd


def rows(rank, k):
    return mx.nd.array(np.arange(k * 2).reshape(k, 2) + 100 * rank, dtype="int64")


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {"rank": r, "size": n, "cross": [hvd.cross_rank(), hvd.cross_size()], "init": hvd.is_initialized()}
    v = mx.nd.array([float(r), -float(r), 2.0 + r])
    hvd.start_timeline(sys.argv[1])             # rank 0 records the next three calls
    out["avg"] = hvd.allreduce(v, name="v").asnumpy().tolist()
    out["sum"] = hvd.allreduce(v, average=False, name="v").asnumpy().tolist()
    out["op_sum"] = hvd.allreduce(v, op=hvd.Sum, name="v").asnumpy().tolist()
    hvd.stop_timeline()
    out["min"] = hvd.allreduce(v, op=hvd.Min, name="mn").asnumpy().tolist()
    out["max"] = hvd.allreduce(v, op=hvd.Max).asnumpy().tolist()                  # unnamed
    out["prod"] = hvd.allreduce(v, op=hvd.Product, name="pr").asnumpy().tolist()
    out["max_scaled"] = hvd.allreduce(v, op=hvd.Max, name="ms", prescale_factor=2.0,
                                      postscale_factor=3.0).asnumpy().tolist()
    out["avg_zero"] = hvd.allreduce(v, average=0, name="v").asnumpy().tolist()      # falsy: a sum, as Horovod
    out["int_prescale"] = hvd.allreduce(mx.nd.array([7, -7], dtype="int32"), op=hvd.Sum, name="i",
                                        prescale_factor=0.5).asnumpy().tolist()     # 3 each, cast in float64
    half = hvd.allreduce(mx.nd.array([1.0], dtype="float16"), op=hvd.Sum, postscale_factor=0.25, name="h")
    out["half"] = [half.dtype.__name__, half.asnumpy().tolist()]
    w = mx.nd.ones((2,)) * (r + 1)
    same = hvd.allreduce_(w, op=hvd.Sum, name="w")
    out["inplace"] = [same is w, w.asnumpy().tolist()]
    group = [mx.nd.ones((2,)) * (r + 1), mx.nd.ones((3,)) * 10 * (r + 1)]
    out["grouped"] = [t.asnumpy().tolist() for t in hvd.grouped_allreduce(group, average=False, name="g")]
    hvd.grouped_allreduce_(group, average=True, name="g2")
    out["grouped_"] = [t.asnumpy().tolist() for t in group]

    b = mx.nd.ones((2, 2)) * r
    out["bcast"] = hvd.broadcast(b, root_rank=1, name="b").asnumpy().tolist()
    out["bcast_kept"] = b.asnumpy().tolist()                     # broadcast does not change its input
    hvd.broadcast_(b, root_rank=2)
    out["bcast_"] = b.asnumpy().tolist()
    try:
        hvd.broadcast(mx.nd.ones(1), root_rank=r, name="roots")
        out["roots"] = None
    except ValueError as exc:
        out["roots"] = str(exc)

    out["ag"] = hvd.allgather(rows(r, r + 1), name="ag").asnumpy().tolist()
    out["ag_again"] = hvd.allgather(rows(r, 3 - r), name="ag").asnumpy().tolist()   # other sizes, same name
    out["ag_dtype"] = hvd.allgather(rows(r, 1)).dtype.__name__
    out["gag"] = [t.asnumpy().tolist() for t in hvd.grouped_allgather([rows(r, 1), mx.nd.ones((r + 1, 3))], name="gg")]
    x = mx.nd.array(np.arange(7 * 2).reshape(7, 2) * (r + 1), dtype="float32")
    out["rs"] = hvd.reducescatter(x, op=hvd.Sum, name="rs").asnumpy().tolist()       # rows 3, 2, 2
    out["rs_avg"] = hvd.reducescatter(x).asnumpy().tolist()
    out["grs"] = [t.asnumpy().tolist() for t in hvd.grouped_reducescatter([x, x[:3]], op=hvd.Sum,
                                                                          postscale_factor=0.5)]
    splits = [(r + j) % 3 for j in range(n)]                 # rank r sends (r + j) % 3 rows to rank j
    got, received = hvd.alltoall(rows(r, sum(splits)), splits=mx.nd.array(splits, dtype="int32"), name="a2a")
    out["a2a"], out["a2a_recv"] = got.asnumpy().tolist(), received.asnumpy().tolist()
    out["a2a_even"] = hvd.alltoall(rows(r, 2 * n)).asnumpy().tolist()
    for args in ((rows(r, 4),), (rows(r, 3), mx.nd.array([1, 1, 1], dtype="float32"))):
        try:
            hvd.alltoall(*args)
        except RuntimeError as exc:
            out.setdefault("a2a_refused", []).append(str(exc))
    out["obj"] = hvd.broadcast_object({"epoch": 3, "from": r, "t": (1, 2)} if r == 1 else None, root_rank=1)
    out["objs"] = hvd.allgather_object({"rank": r, "s": "x" * r, "a": mx.nd.ones(r + 1) * r})
    out["objs"] = [{**o, "a": o["a"].asnumpy().tolist()} for o in out["objs"]]
    try:
        hvd.allgather(mx.nd.zeros((1, 3 if r == 1 else 2)), name="bad")
        out["ag_bad"] = None
    except ValueError as exc:
        out["ag_bad"] = str(exc)
    try:
        hvd.allreduce(mx.nd.zeros((3 if r == 2 else 2,)), name="badsum")
        out["sum_bad"] = None
    except ValueError as exc:
        out["sum_bad"] = str(exc)
    out["after"] = hvd.allreduce(mx.nd.ones(2), op=hvd.Sum, name="after").asnumpy().tolist()
    for bad in ("Adasum", hvd.Adasum):
        try:
            hvd.allreduce(v, op=bad, name="x")
        except ValueError as exc:
            out.setdefault("refused", []).append(str(exc))
    # process sets: {0, 2} and {1} side by side
    evens, odd = hvd.add_process_set([0, 2]), hvd.add_process_set(hvd.ProcessSet([1]))
    mine = evens if r != 1 else odd
    out["set_sum"] = hvd.allreduce(mx.nd.ones(2) * (r + 1), op=hvd.Sum, name="s", process_set=mine).asnumpy().tolist()
    out["set_avg"] = hvd.allreduce(mx.nd.ones(2) * (r + 1), name="s", process_set=mine).asnumpy().tolist()
    out["set_ag"] = hvd.allgather(rows(r, 1), name="s", process_set=mine).asnumpy().tolist()
    root = 2 if r != 1 else 1
    out["set_bcast"] = hvd.broadcast(mx.nd.ones(1) * r, root_rank=root, process_set=mine).asnumpy().tolist()
    try:
        hvd.allreduce(mx.nd.ones(1), name="x", process_set=odd if r != 1 else evens)
    except ValueError as exc:
        out["set_refused"] = str(exc)
    out["set_ids"] = [evens.process_set_id, odd.process_set_id, hvd.process_set_by_id(evens.process_set_id) is evens]
    assert hvd.remove_process_set(odd) and not hvd.remove_process_set(odd)
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()
    out_after = hvd.is_initialized()
    print(f"SHUTDOWN {r} {out_after}", flush=True)


if __name__ == "__main__":
    main()
