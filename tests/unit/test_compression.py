import numpy as np
import pytest

from ps import compression as comp


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
