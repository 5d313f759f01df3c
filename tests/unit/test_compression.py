import numpy as np
import pytest

from ps import compression as comp
from ps.message import Op


def test_pack_layout_msb_first():
    codes = np.array([1, -1, 0, 1, 0, 0, 0, -1], np.int8)
    packed = comp.pack_2bit(codes)
    assert packed.nbytes == 4                      # padded to one float32 word (16 codes)
    assert packed[0] == 0b11_10_00_11 and packed[1] == 0b00_00_00_10
    np.testing.assert_array_equal(comp.unpack_2bit(packed, 8, 0.5),
                                  [0.5, -0.5, 0, 0.5, 0, 0, 0, -0.5])


def test_residual_carries_at_most_one_threshold():
    residual = np.zeros(3, np.float32)
    codes = comp.quantize_2bit(np.array([2.0, -0.4, 0.5], np.float32), residual, 0.5)
    np.testing.assert_array_equal(codes, [1, 0, 1])
    np.testing.assert_allclose(residual, [1.5, -0.4, 0.0])


@pytest.mark.parametrize("params", [{"type": "1bit"}, {"type": "2bit", "threshold": 0}, "2bit", {}])
def test_bad_params(params):
    with pytest.raises(ValueError):
        comp.parse(params)


def test_the_wire_bits_are_the_ones_message_op_names():
    from ps.message import Op
    assert (Op.TWO_BIT, Op.FP16, Op.HALF_PULL) == (Op.TWO_BIT, Op.FP16, Op.HALF_PULL) == (8, 16, 64)


def test_a_2bit_compressor_quantizes_with_a_residual_per_key_and_packs_each_chunk():
    c = comp.Compressor(comp.parse({"type": "2bit", "threshold": 0.5}))
    bits, codes, encode = c.wire(3, np.array([0.3, -0.6], np.float32), True, True)
    assert bits == Op.TWO_BIT and encode is comp.pack_2bit       # 2bit halves no pull
    np.testing.assert_array_equal(codes, [0, -1])
    _, codes, _ = c.wire(3, np.array([0.3, 0.0], np.float32), True, False)
    np.testing.assert_array_equal(codes, [1, 0])                  # 0.3 + 0.3 carried over
    _, codes, _ = c.wire(4, np.array([0.3, 0.0], np.float32), True, False)
    np.testing.assert_array_equal(codes, [0, 0])                  # another key: its own residual


def test_an_fp16_compressor_halves_pushes_and_by_default_pulls():
    c = comp.Compressor(comp.parse({"type": "fp16"}))
    bits, value, encode = c.wire(3, np.array([1.5], np.float32), True, True)
    assert bits == Op.FP16 | Op.HALF_PULL and value.dtype == np.float16 and encode is None
    assert c.wire(3, None, False, True) == (Op.HALF_PULL, None, None)
    exact = comp.Compressor(comp.parse({"type": "fp16", "pull": False}))
    assert exact.wire(3, None, False, True) == (0, None, None)


def test_what_is_not_pushed_travels_as_it_is():
    value = np.ones(2, np.float32)
    bits, same, encode = comp.Compressor(comp.parse({"type": "2bit"})).wire(3, value, False, False)
    assert (bits, encode) == (0, None) and same is value


def test_frame_layout_is_what_the_compressor_sends():
    codes = comp.quantize_2bit(np.ones(17, np.float32), np.zeros(17, np.float32), 0.5)
    assert comp.frame_layout(True, Op.TWO_BIT, 17) == (np.dtype(np.uint8), comp.pack_2bit(codes).nbytes) == \
        (np.uint8, 8)
    assert comp.frame_layout(True, Op.FP16 | Op.HALF_PULL, 3) == (np.float16, 6)
    assert comp.frame_layout(False, Op.FP16 | Op.HALF_PULL, 3) == (np.float16, 6)
    assert comp.frame_layout(False, Op.TWO_BIT | Op.FP16, 3) is None       # replies to those are plain
    assert comp.frame_layout(True, Op.HALF_PULL, 3) is None


def test_a_server_decodes_2bit_with_its_threshold_and_merges_fp16_as_it_came():
    packed = comp.pack_2bit(np.array([1, -1, 0], np.int8))
    out = comp.decode_push(Op.TWO_BIT, packed, 3, np.float64, {"type": "2bit", "threshold": 0.25})
    assert out.dtype == np.float64 and out.tolist() == [0.25, -0.25, 0]
    half = np.ones(3, np.float16)
    assert comp.decode_push(Op.FP16, half, 3, np.float32, None) is half


@pytest.mark.parametrize("params", [None, {"type": "fp16", "threshold": 0.5, "pull": True}])
def test_a_2bit_push_to_servers_without_2bit_is_refused(params):
    with pytest.raises(comp.UnsetError, match="a 2bit-compressed push arrived but the servers have no 2bit"):
        comp.decode_push(Op.TWO_BIT, np.zeros(4, np.uint8), 3, np.float32, params)
