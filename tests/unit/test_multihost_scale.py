"""ps/bench/multihost.py --scale: a smaller model on slower links must keep the full model's
key placement and send thresholds, or it measures an incast the full model never has."""
import math

from ps.bench.multihost import load_model, scaled, scaled_env, simple_bound
from ps.keys import plan


def test_the_byte_thresholds_scale_with_the_model():
    assert scaled_env(1.0) == {}
    assert scaled_env(0.05) == {"MXNET_KVSTORE_BIGARRAY_BOUND": "50000", "PS_SEND_WINDOW": str(round(0.05 * (8 << 20))),
                                "PS_SEND_LOWAT": str(round(0.05 * (128 << 10)))}


def test_at_a_twentieth_of_its_bytes_resnet50_splits_the_same_tensors_over_the_servers():
    full, small = load_model("resnet50_v1"), scaled(load_model("resnet50_v1"), 0.05)
    bound = int(scaled_env(0.05)["MXNET_KVSTORE_BIGARRAY_BOUND"])

    def split(shapes, bound):
        sizes = [math.prod(s) for s in shapes]
        return [k for k, n in enumerate(sizes) if len(plan(k, n, 8, bound)) > 1]
    assert split(full, 1_000_000) and split(small, bound) == split(full, 1_000_000)
    assert split(small, 1_000_000) == []             # unscaled: every key on one server
    # and the bound knows it: one server's port takes every worker's push of a whole key
    assert simple_bound(small, 8, 0.0, 6.25e6, bigarray_bound=bound) < simple_bound(small, 8, 0.0, 6.25e6)
