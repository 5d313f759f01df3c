"""ps/torch/fusion.py's bucket layout: which gradients share a key, in what order (pure)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ps.torch import fusion


def layout_of(sizes, limit, dtypes=None):
    """Buckets as lists of parameter names, in the order they fill; the rest go alone."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    names = {p: f"p{i}" for i, p in enumerate(params)}
    dtypes = dtypes or [np.dtype(np.float32)] * len(sizes)
    wires = {p: (f"key.{names[p]}", (n,), d) for p, n, d in zip(params, sizes, dtypes)}
    priority = {p: -i for i, p in enumerate(params)}
    members = fusion.layout(names, wires, priority, limit,
                            lambda name, shape, dtype: f"{name}:{shape[0]}:{np.dtype(dtype).str}")
    out = []
    for bucket in fusion.buckets(members):
        out.append((bucket.key, [names[p] for p in bucket.params], bucket.priority))
        starts = [members[p].start for p in bucket.params]
        assert starts == list(np.cumsum([0] + [members[p].size for p in bucket.params])[:-1])
    return out


def test_consecutive_small_gradients_share_a_bucket_last_layer_first():
    # float32: 10 elements = 40 bytes; limit 100 bytes
    got = layout_of([10, 10, 30, 10, 10, 10], 100)
    assert got == [("allreduce.grad.fused.p5.2:20:<f4", ["p5", "p4"], -4),      # p3 would make 120 bytes
                   ("allreduce.grad.fused.p1.2:20:<f4", ["p1", "p0"], 0)]
    # p2 (120 bytes) goes alone and ends the run it interrupts, so p3, a run of one, goes alone too


def test_large_gradients_go_alone_and_so_does_a_bucket_of_one():
    assert layout_of([100, 5, 100], 100) == []             # 400 bytes each, and p1 alone between them
    assert layout_of([5, 5], 0) == []                      # 0: no fusion


def test_a_bucket_holds_one_dtype():
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    got = layout_of([4, 4, 4, 4], 1000, [f32, f32, f16, f16])
    assert [names for _, names, _ in got] == [["p3", "p2"], ["p1", "p0"]]
    assert got[0][0].endswith(":<f2") and got[1][0].endswith(":<f4")


def test_a_bucket_leaves_once_full_and_every_step_has_its_own_pending_sum():
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    names = {p: f"p{i}" for i, p in enumerate(params)}
    wires = {p: ("k", (3,), np.dtype(np.float32)) for p in params}
    members = fusion.layout(names, wires, {p: 0 for p in params}, 1 << 20, lambda *a: "bucket")
    bucket = members[params[0]].bucket
    first = bucket.put(members[params[1]], np.full(3, 2.0, np.float32))
    pending = bucket.pending
    assert not bucket.full and not pending.done
    with pytest.raises(RuntimeError, match="bucket was never sent"):
        pending.wait()
    bucket.put(members[params[0]], np.full(3, 1.0, np.float32))
    assert bucket.full and bucket.buffer.tolist() == [2.0] * 3 + [1.0] * 3 and first.tolist() == [2.0] * 3   # p1 first
    bucket.sent("handle")
    assert pending.handle == "handle" and bucket.filled == 0
    bucket.put(members[params[1]], np.zeros(3, np.float32))
    assert bucket.pending is not pending                  # the next step's sum is another
