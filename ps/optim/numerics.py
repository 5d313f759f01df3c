"""How MXNet 1.9.1 turns hyper-parameters into numbers, and the few kernels whose exact
rounding ps must reproduce (used by ``ps/optim.py``).

MXNet parses op parameters with dmlc's float parser (not correctly rounded), keeps some
scalars in double, and computes LAMB's power with C's ``powf``; matching those choices is
what makes ps's updates bit-identical to MXNet's instead of merely close.
"""
from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

@functools.lru_cache(maxsize=4096)
def _dmlc_parse(x: float, ft: type) -> Any:
    """The number an MXNet op parameter holds: dmlc's ``ParseFloat`` of ``str(x)``.

    It is not correctly rounded (about 10% of float32 values land one ulp off the
    nearest), so numpy's own conversion would not reproduce MXNet's updates.
    """
    s = repr(float(x))
    if not math.isfinite(x):
        return ft(x)
    neg, s = s.startswith("-"), s.lstrip("-")
    mantissa, _, exp = s.partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    with np.errstate(over="ignore", under="ignore"):
        value = ft(int(int_part))
        digits = frac_part[:19]  # dmlc ignores digits past 19
        if digits:
            value = value + ft(float(int(digits)) / float(10 ** len(digits)))
        if exp:
            e = int(exp)
            value = _dmlc_scale(value, min(abs(e), 38 if ft is np.float32 else 308), e < 0, ft)
    return -value if neg else value


def _dmlc_scale(value: Any, e: int, divide: bool, ft: type) -> Any:
    scale = ft(1)
    while e >= 8:
        scale, e = scale * ft(1e8), e - 8
    while e > 0:
        scale, e = scale * ft(10.0), e - 1
    return value / scale if divide else value * scale


def f32(dt: type, x: float) -> Any:
    """A float op parameter (``lr=``, ``wd=``, ``beta1=`` ...) as the kernel sees it in dtype ``dt``."""
    return dt(_dmlc_parse(float(x), np.float32))


def tuple_f32(dt: type, x: float) -> Any:
    """An element of a tuple parameter (``lrs=``/``wds=`` of multi-tensor ops): nearest float32."""
    return dt(np.float32(x))


def scalar(dt: type, x: float) -> Any:
    """The scalar of an NDArray-with-scalar op (``nd * 0.5``): a double, cast to the array dtype."""
    return dt(_dmlc_parse(float(x), np.float64))


def clip(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    """mshadow's clip: ``hi`` wins when the bounds cross, NaN passes through."""
    return np.where(x > hi, hi, np.where(x < lo, lo, x)).astype(x.dtype, copy=False)


def sign(x: np.ndarray) -> np.ndarray:
    """``(x > 0) - (x < 0)`` as MXNet computes it (NaN gives 0, unlike ``np.sign``)."""
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@functools.cache
def _libm_powf() -> Callable[[float, float], float] | None:
    """libm's ``powf``, looked up at the first float32 power: Python itself links libm, so
    it is among the process's own symbols (``ctypes.util.find_library`` would import
    subprocess and tempfile in every process that imports the optimizers, and run ldconfig)."""
    for lib in (None, "libm.so.6"):
        try:
            fn = ctypes.CDLL(lib).powf
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
        return fn
    return None


def power(base: Any, exp: int) -> Any:
    """mshadow's power: C ``powf`` for float32, double ``pow`` otherwise.

    numpy 2's float32 power is not libm's and differs from it in the last bit at times.
    """
    dt = type(base)
    powf = _libm_powf() if dt is np.float32 else None
    if powf is not None:
        return np.float32(powf(float(base), float(exp)))
    return dt(math.pow(float(base), exp))  # without libm: off by 1 ulp in ~0.2% of cases


def kernel_momentum(dt: type, momentum: float) -> Any:
    """MXNet passes ``momentum`` to the kernel only if > 0; otherwise the kernel's default 0 applies."""
    return f32(dt, momentum if momentum > 0 else 0.0)


def zeros(weight: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    return tuple(np.zeros_like(weight) for _ in range(n))


def sum_sq(x: np.ndarray) -> np.float32:
    """MXNet's CPU ``multi_sum_sq``: squares in the array dtype, summed one by one in float32."""
    if x.size == 0:
        return np.float32(0)
    return np.cumsum((x * x).astype(np.float32, copy=False), dtype=np.float32)[-1]
