"""Row-sparse updates on the server against MXNet 1.9.1's own updater on row_sparse gradients.

MXNet updates only the gradient's rows for sgd and adam with ``lazy_update=True`` (and for
its ``test`` optimizer, trivially); with ``lazy_update=False`` and elsewhere the missing rows
count as zero gradient. ``Updater.update_rows`` must give the same numbers either way, step
after step with different rows touched, states (momentum, Adam's moments) included.
"""
import msgpack
import numpy as np
import pytest

from ps.optim import Updater, from_spec
from ps.optim.from_mxnet import spec_from_mxnet

mx = pytest.importorskip("mxnet")
pytestmark = pytest.mark.mxnet

SHAPE = (12, 5)
CASES = [
    ("sgd", {"momentum": 0.9, "wd": 0.01}), ("sgd", {"wd": 0.01}),
    ("sgd", {"momentum": 0.9, "wd": 0.01, "lazy_update": False}),
    ("adam", {"wd": 0.01}), ("adam", {"lazy_update": False}),
    ("test", {}), ("rmsprop", {}),
]


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_row_sparse_updates_match_mxnet(name, kwargs):
    rng = np.random.default_rng(7)
    opt = mx.optimizer.create(name, learning_rate=0.1, rescale_grad=0.5, **kwargs)
    ps_updater = Updater(from_spec(msgpack.unpackb(msgpack.packb(spec_from_mxnet(opt)), strict_map_key=False)))
    mx_updater = mx.optimizer.get_updater(opt)
    weight = rng.standard_normal(SHAPE).astype(np.float32)
    mx_weight = mx.nd.array(weight)
    for step in range(5):
        rows = np.sort(rng.choice(SHAPE[0], size=4, replace=False))
        grad = rng.standard_normal((rows.size, SHAPE[1])).astype(np.float32)
        mx_updater(0, mx.nd.sparse.row_sparse_array((grad, rows), shape=SHAPE), mx_weight)
        ps_updater.update_rows(0, rows, grad, weight)
        np.testing.assert_allclose(weight, mx_weight.asnumpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} {kwargs} step {step}")
    untouched = weight.copy()
    ps_updater.update_rows(0, np.array([0], np.int64), np.zeros((1, SHAPE[1]), np.float32), weight)
    if ps_updater.optimizer.lazy_rows:     # the lazy rule really left the other rows alone
        np.testing.assert_array_equal(weight[1:], untouched[1:])
