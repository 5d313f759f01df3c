"""ps/bench/multihost.py --scale: a smaller model on slower links must keep the full model's
key placement and send thresholds, or it measures an incast the full model never has."""
import math
import re

import pytest

from ps.bench.multihost import load_model, scaled, scaled_env, simple_bound
from ps.keys import plan


def test_the_byte_thresholds_scale_with_the_model():
    assert scaled_env(1.0) == {}
    assert scaled_env(0.05) == {"MXNET_KVSTORE_BIGARRAY_BOUND": "50000", "PS_SEND_WINDOW": str(round(0.05 * (8 << 20))),
                                "PS_SEND_LOWAT": str(round(0.05 * (128 << 10))),
                                "PS_CHUNK_BYTES": "98304"}     # at its floor; PS_TORCH_FUSION: off
    assert scaled_env(0.1)["PS_CHUNK_BYTES"] == "104856"       # 0.1 MiB, in whole 8-byte words


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


def test_server_only_hosts_halve_what_a_worker_host_sends_at_k4():
    """--server-hosts M: a worker host sends its model once a step, not 2(K-1)/K times; with
    fewer server hosts than workers, the server hosts' links are the bound."""
    shapes = load_model("resnet50_v1")
    model = 4 * sum(math.prod(s) for s in shapes)
    link = 125e6                                                  # 1 Gbit/s
    colocated = simple_bound(shapes, 4, 0.0, link)
    apart = simple_bound(shapes, 4, 0.0, link, servers=4, server_hosts=4)
    assert math.isclose(apart, model / link, rel_tol=0.05), (apart, model / link)
    assert math.isclose(colocated / apart, 1.5, rel_tol=0.08), (colocated, apart)
    two = simple_bound(shapes, 4, 0.0, link, servers=2, server_hosts=2)
    assert math.isclose(two, 2 * model / link, rel_tol=0.1), (two, model / link)   # 4 workers' pushes on 2 links


def test_a_torch_job_takes_variables_as_a_variant_and_a_bad_one_is_named():
    from ps.bench.multihost import impl_env
    impl = impl_env("ps-torch-cross:PS_SEND_LOWAT=0:PS_TORCH_FUSION=1M")
    assert (impl.kind, impl.env) == ("ps-torch-cross", {"PS_SEND_LOWAT": "0", "PS_TORCH_FUSION": "1M"})
    assert impl_env("ps:PS_SEND_WINDOW=0").kind == "ps"
    for bad in ("ddp:PS_SEND_LOWAT=0", "ps-torch:PS_SEND_LOWAT", "psx"):
        with pytest.raises(SystemExit, match=re.escape(repr(bad))):
            impl_env(bad)
