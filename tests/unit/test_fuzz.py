"""The decoder never crashes on hostile input: it returns a Message or raises ProtocolError."""
import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ps.errors import ProtocolError
from ps.message import VERSION, Command, Message, Op, decode, encode

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def try_decode(frames):
    try:
        msg = decode(frames)
    except ProtocolError:
        return None
    assert isinstance(msg, Message)
    return msg


@FAST
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=5))
def test_random_frames(frames):
    try_decode(frames)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=5),
                    st.binary(max_size=5))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=9),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                      max_leaves=30)


@FAST
@given(values, st.lists(st.binary(max_size=64), max_size=3))
def test_random_msgpack_meta(meta, extra):
    try_decode([msgpack.packb(meta), *extra])


@FAST
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(-3, 30), st.integers(-3, 30), st.integers(-3, 30),
                          st.integers(-1, 8)), max_size=6),
       st.lists(st.binary(max_size=120), max_size=6), st.booleans())
def test_plausible_data_entries(entries, frames, request):
    body = [[1, op, 3, off, n, total, code, None] for op, off, n, total, code in entries]
    msg = try_decode([msgpack.packb([VERSION, int(Command.DATA), 9, 8, request, 0, body]), *frames])
    if msg is not None:          # whatever passes is internally consistent
        for arr in msg.frames:
            assert isinstance(arr, np.ndarray)


@FAST
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_mutated_valid_message(position, value):
    body = [[1, int(Op.PUSH), 3, 0, 4, 4, 0, None], [2, int(Op.PULL), 4, 0, 4, 4, 0, None]]
    frames = encode(Message(Command.DATA, 9, 8, body, [np.arange(4, dtype=np.float32)]))
    meta = bytearray(frames[0])
    meta[position % len(meta)] = value
    try_decode([bytes(meta), frames[1].tobytes()])
