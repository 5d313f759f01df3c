"""Horovod's collectives beyond allreduce (allgather, alltoall, reducescatter, Min/Max/Product,
grouped and in-place forms, autograd through them) on every rank; prints one RESULT line
of JSON that tests/torch/test_collectives.py checks against numpy."""
import json

import torch

import ps.torch as hvd


def rows(rank, k, cols=3, dtype=torch.float32):
    return (torch.arange(k * cols, dtype=torch.float64).reshape(k, cols) + 100 * rank).to(dtype)


class Halve(hvd.Compressor):
    """A compressor of the script's own, in Horovod's interface."""

    @staticmethod
    def compress(tensor):
        return tensor / 2, 2.0

    @staticmethod
    def decompress(tensor, ctx):
        return tensor * ctx


def horovods_rules(out, r):
    """What Horovod's own test suite checks: dtypes, a name reused with another shape, a name
    twice in flight, roots that disagree, objects, compressors, sparse sums, autograd."""
    out["i16"] = hvd.allreduce(torch.tensor([r + 1, -(r + 1)], dtype=torch.int16), op=hvd.Sum).tolist()
    out["ag_i16"] = hvd.allgather(torch.tensor([r], dtype=torch.int16)).tolist()
    out["bf16"] = hvd.allreduce(torch.tensor([0.5 * (r + 1)], dtype=torch.bfloat16)).float().tolist()
    out["reuse"] = [hvd.allreduce(torch.ones(k), name="reuse", op=hvd.Sum).tolist() for k in (2, 3)]
    out["int_prescale"] = hvd.allreduce(torch.tensor([7, -7], dtype=torch.int32), op=hvd.Sum,
                                        prescale_factor=0.5).tolist()
    out["twice"] = None
    if r != 0:                  # a name twice in flight: rank 0 has not started it, so the first
        first = hvd.allreduce_async(torch.ones(2), name="twice")     # cannot end before the second call
        try:
            hvd.allreduce_async(torch.ones(2), name="twice")
        except ValueError as exc:
            out["twice"] = str(exc)
    hvd.barrier()               # (the last rank to start it could see its first end at once: the name is
    if r == 0:                  # free again then, as in Horovod, and its second call a round of its own)
        first = hvd.allreduce_async(torch.ones(2), name="twice")
    hvd.synchronize(first)
    if r == 0:                  # a new name's first use meets nobody: rank 0 starts it while the others
        early = hvd.allreduce_async(torch.ones(2), name="first_use", op=hvd.Sum)     # wait at a barrier
    hvd.barrier()
    if r != 0:
        early = hvd.allreduce_async(torch.ones(2), name="first_use", op=hvd.Sum)
    out["first_use"] = hvd.synchronize(early).tolist()
    if r == 0:                  # a handle dropped at once: the name stays taken while in flight
        hvd.allreduce_async(torch.ones(2), name="dropped")
        try:
            hvd.allreduce_async(torch.ones(2), name="dropped")
            out["dropped"] = None
        except ValueError as exc:
            out["dropped"] = str(exc)
    hvd.barrier()
    if r != 0:
        hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="dropped"))
    # an allgather_async goes on by itself: rank 0 waits for it before an allreduce the
    # others make first, and they synchronize their gathers only after that allreduce
    gathering = hvd.allgather_async(torch.full((r + 1, 2), float(r)), name="order")
    if r == 0:
        got = hvd.synchronize(gathering)
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="order_sum")
    else:
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="order_sum")
        got = hvd.synchronize(gathering)
    out["gather_order"] = [got[:, 0].tolist(), total.item()]
    try:
        hvd.broadcast(torch.ones(2), root_rank=r, name="roots")
        out["roots"] = None
    except hvd.HorovodInternalError as exc:
        out["roots"] = str(exc)
    obj = {"epoch": 3, 0: (1, 2), "t": torch.arange(3), "s": {"a"}} if r == 0 else None
    out["bcast_obj"] = repr(hvd.broadcast_object(obj, root_rank=0))
    out["ag_obj_keys"] = repr(hvd.allgather_object({r: (r,)}))
    out["custom"] = hvd.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum, compression=Halve).tolist()
    dense = torch.zeros(5, 2)
    dense[r] = r + 1
    dense[4] = 1
    out["sparse"] = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp", op=hvd.Sum)().to_dense().tolist()
    for as_dense in (False, True):                  # Embedding(sparse=True) through the optimizer
        emb = torch.nn.Embedding(5, 2, sparse=True)
        other = torch.nn.Embedding(5, 2, sparse=True)   # two sparse parameters in one optimizer
        torch.nn.init.zeros_(emb.weight)
        torch.nn.init.zeros_(other.weight)
        opt = hvd.DistributedOptimizer(torch.optim.SGD([emb.weight, other.weight], lr=1.0),
                                       sparse_as_dense=as_dense)
        (emb(torch.tensor([r, 4])).sum() + other(torch.tensor([r, 4])).sum()).backward()
        opt.step()
        out[f"emb_{as_dense}"] = emb.weight.detach().tolist()
        out[f"other_{as_dense}"] = other.weight.detach().tolist()
    model = torch.nn.Linear(3, 2)                   # the checkpoint pattern: only the root has state
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    if r == 0:
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["opt_state"] = [[float(st["step"]), st["exp_avg"].flatten().tolist()] for st in opt.state.values()]
    out["params_kept"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    w = torch.full((2,), float(r + 1), requires_grad=True)
    hvd.broadcast(w, root_rank=1).sum().backward()
    out["bcast_grad"] = w.grad.tolist()
    ws = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
    sum(t.sum() for t in hvd.grouped_allreduce(ws, op=hvd.Sum)).backward()
    out["gar_grad"] = [t.grad.tolist() for t in ws]
    out["sync_bn"] = sync_batch_norm(r)


def process_sets(out, r):
    """Collectives over some of the workers: ranks {0, 2} and {1} at once, each set's results
    its own members' only; then the refusals."""
    if r == 0:                  # in flight across add_process_set: the others start it only after it
        across = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="across_add")
    even, odd = hvd.add_process_set([0, 2]), hvd.add_process_set(hvd.ProcessSet([1]))
    if r != 0:
        across = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="across_add")
    mine = even if r % 2 == 0 else odd
    got = out["sets"] = {"id": mine.process_set_id, "rank": mine.rank(), "size": mine.size()}
    got["across_add"] = hvd.synchronize(across).tolist()
    got["sum"] = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum, name="x", process_set=mine).tolist()
    got["avg"] = hvd.allreduce(torch.full((2,), float(r + 1)), process_set=mine).tolist()
    got["ag"] = hvd.allgather(rows(r, r + 1), process_set=mine).tolist()
    got["bcast"] = hvd.broadcast(torch.full((2,), float(r)), root_rank=mine.ranks[-1], process_set=mine).tolist()
    got["obj"] = hvd.broadcast_object({"from": r} if r == mine.ranks[0] else None, mine.ranks[0], process_set=mine)
    got["a2a"] = hvd.alltoall(rows(r, 2 * mine.size()), process_set=mine).tolist()
    got["rs"] = hvd.reducescatter(rows(r, 3), op=hvd.Sum, process_set=mine).tolist()
    hvd.barrier(process_set=mine)
    torch.manual_seed(r)                            # a model per set, trained on each member's data
    model = torch.nn.Linear(3, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=mine.ranks[0], process_set=mine)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=mine)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    got["weights"] = hvd.allgather(model.weight.detach(), name="weights").tolist()     # every worker's
    solo, alone = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)  # the even set's optimizer, on every worker
    alone.load_state_dict(solo.state_dict())
    opts = [hvd.DistributedOptimizer(torch.optim.SGD(solo.parameters(), lr=0.5), process_set=even),
            torch.optim.SGD(alone.parameters(), lr=0.5)]
    for m, opt in zip((solo, alone), opts):
        m(torch.full((1, 2), float(r + 1))).sum().backward()
        opt.step()
    got["own_step"] = torch.equal(solo.weight, alone.weight)    # outside the set: its own gradients
    got["global"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").tolist()
    refused = got["refused"] = []
    for call in (lambda: hvd.allreduce(torch.ones(1), process_set=odd if mine is even else even),
                 lambda: hvd.add_process_set([0, 2]),
                 lambda: hvd.add_process_set([0, 1] if r == 0 else [1, 2])):
        try:
            call()
            refused.append(None)
        except ValueError as exc:
            refused.append(str(exc))
    got["removed"] = [hvd.remove_process_set(odd), hvd.remove_process_set(even),
                      hvd.remove_process_set(hvd.global_process_set), odd.process_set_id]
    try:
        hvd.allreduce(torch.ones(1), process_set=mine)
        refused.append(None)
    except ValueError as exc:
        refused.append(str(exc))


def joins(out, r):
    """Uneven work (Horovod's join): rank r runs r + 1 steps of a sum and of a
    DistributedOptimizer, then joins; the ranks still running sum without it (its share
    zero, an average still over every rank). Then, with rank 0 joined, an allgather is refused."""
    got = out["join"] = {"sums": []}
    model = torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
    for _ in range(r + 1):
        got["sums"].append(hvd.allreduce(torch.ones(2) * (r + 1), op=hvd.Sum, name="uneven").tolist())
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    if r == 2:                  # ranks 0 and 1 have joined
        got["avg"] = hvd.allreduce(torch.full((1,), 3.0), name="uneven_avg").tolist()
    got["weight"] = model.weight.detach().flatten().tolist()
    got["last"] = hvd.join()
    got["after"] = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="uneven").tolist()     # every rank again
    if r == 0:
        hvd.join()
    else:
        try:
            hvd.allgather(torch.ones(1, 1), name="while_joined")
            got["refused"] = None
        except RuntimeError as exc:
            got["refused"] = str(exc)
        try:                    # its sum fails too, after the root check raised: join still waits it out
            hvd.broadcast(torch.ones(3), root_rank=1, name="while_joined")
            got["refused_bcast"] = None
        except RuntimeError as exc:
            got["refused_bcast"] = str(exc)
        hvd.join()


def sync_batch_norm(r):
    """hvd.SyncBatchNorm on rank r's two rows against BatchNorm1d (and, on images, BatchNorm2d)
    on all rows in one process: the largest difference in outputs, running stats and
    gradients of the sum of the losses."""
    return max(_sync_batch_norm(r, (4,), torch.nn.BatchNorm1d), _sync_batch_norm(r, (3, 2, 2), torch.nn.BatchNorm2d))


def _sync_batch_norm(r, shape, reference):
    n, c = hvd.size(), shape[0]
    count = 2 * n * int(torch.tensor(shape).prod())
    data = (torch.arange(count, dtype=torch.float32).reshape(2 * n, *shape) ** 1.5) / 7 + 30
    weights = torch.linspace(-1.0, 2.0, count).reshape(2 * n, *shape)
    sbn, bn = hvd.SyncBatchNorm(c), reference(c)
    for m in (sbn, bn):
        with torch.no_grad():
            m.weight.copy_(torch.linspace(0.5, 2.0, c))
            m.bias.copy_(torch.linspace(-1.0, 1.0, c))
    x, full = data.clone().requires_grad_(), data.clone().requires_grad_()
    own = slice(2 * r, 2 * r + 2)
    y, y_full = sbn(x[own]), bn(full)
    (y * weights[own]).sum().backward()
    (y_full * weights).sum().backward()
    summed = [hvd.allreduce(t, op=hvd.Sum, name=f"sbn.{i}") for i, t in enumerate((sbn.weight.grad, sbn.bias.grad))]
    return max(float((a - b).abs().max()) for a, b in [
        (y, y_full[own]), (sbn.running_mean, bn.running_mean), (sbn.running_var, bn.running_var),
        (x.grad[own], full.grad[own]), (summed[0], bn.weight.grad), (summed[1], bn.bias.grad)])


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {"rank": r, "size": n, "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
           "local_rank": hvd.local_rank(), "homogeneous": hvd.is_homogeneous()}
    out["ag"] = hvd.allgather(rows(r, r + 1)).tolist()
    out["ag_named"] = [hvd.allgather(rows(r, (r + s) % 3), name="vary").tolist() for s in range(3)]
    out["ag_bool"] = hvd.allgather(torch.tensor([r % 2 == 0, True])).tolist()
    out["ag_int"] = hvd.allgather(torch.tensor([[r, -r, 2 ** 40 + r]], dtype=torch.int64)).tolist()
    out["ag_half"] = hvd.allgather(torch.full((2,), 0.1 * (r + 1), dtype=torch.float16)).float().tolist()
    out["ag_obj"] = hvd.allgather_object({"rank": r, "s": "x" * r})
    out["ag_async"] = hvd.synchronize(hvd.allgather_async(rows(r, 1), name="async")).tolist()
    out["gag"] = [t.tolist() for t in hvd.grouped_allgather([rows(r, 1), rows(r, 2, cols=2)])]

    splits = [(r + j) % 3 for j in range(n)]
    got, received = hvd.alltoall(rows(r, sum(splits)), splits=torch.tensor(splits, dtype=torch.int64))
    out["a2a"], out["a2a_recv"], out["a2a_recv_dtype"] = got.tolist(), received.tolist(), str(received.dtype)
    out["a2a_even"] = hvd.alltoall(rows(r, 2 * n)).tolist()

    out["rs_avg"] = hvd.reducescatter(rows(r, 7)).tolist()
    out["rs_sum"] = hvd.reducescatter(rows(r, 7), op=hvd.Sum, name="rs").tolist()

    v = torch.tensor([float(r), -float(r), 2.0 + r])
    out["min"] = hvd.allreduce(v, op=hvd.Min).tolist()
    out["max"] = hvd.allreduce(v, op=hvd.Max, name="mx").tolist()
    out["prod"] = hvd.allreduce(v, op=hvd.Product).tolist()
    out["scaled"] = hvd.allreduce(torch.ones(2) * (r + 1), op=hvd.Sum, prescale_factor=2.0,
                                  postscale_factor=0.5).tolist()
    group = [torch.ones(2) * (r + 1), torch.ones(2) * (r + 1) * 10]     # one shape twice, unnamed
    hvd.grouped_allreduce_(group, op=hvd.Sum)
    out["gar"] = [t.tolist() for t in group]

    b = torch.full((3,), float(r))
    hvd.broadcast_(b, root_rank=2)
    out["bcast_"] = b.tolist()
    b2 = torch.full((2,), float(r))
    hvd.synchronize(hvd.broadcast_async_(b2, root_rank=1, name="b2"))
    out["bcast_async_"] = b2.tolist()

    w = torch.full((r + 1, 2), 1.0, requires_grad=True)
    g = hvd.allgather(w)
    (g * torch.arange(g.shape[0], dtype=torch.float32).unsqueeze(1)).sum().backward()
    out["ag_grad"] = w.grad.tolist()
    w2 = torch.full((2,), float(r + 1), requires_grad=True)
    (hvd.allreduce(w2, op=hvd.Sum) * (r + 1)).sum().backward()
    out["ar_grad"] = w2.grad.tolist()
    horovods_rules(out, r)
    process_sets(out, r)
    joins(out, r)
    hvd.barrier()
    try:
        hvd.allgather(torch.zeros(1, 4 if r == 1 else 3), name="bad")
        out["mismatch"] = None
    except ValueError as exc:
        out["mismatch"] = str(exc)
    # shapes that differ leave data rounds that never close: raised on every rank, and
    # dropped here, so that shutdown() has nothing left to wait for
    out["mismatch_sum"] = out["mismatch_bcast"] = None
    try:
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)
    except ValueError as exc:
        out["op_and_average"] = str(exc)
    try:
        hvd.allreduce(torch.zeros(3 if r == 1 else 2), name="badsum")
    except ValueError as exc:
        out["mismatch_sum"] = str(exc)
    try:                            # a group whose members all differ: none may stay open
        hvd.grouped_allreduce([torch.ones(2 + r), torch.ones(3 + r)], name="badgroup")
        out["mismatch_group"] = None
    except ValueError as exc:
        out["mismatch_group"] = str(exc)
    try:
        hvd.broadcast_parameters([("p", torch.zeros(2, 2 if r == 2 else 1))], root_rank=0)
    except ValueError as exc:
        out["mismatch_bcast"] = str(exc)
    out["after_mismatch"] = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
