import msgpack
import numpy as np
import pytest

from ps.errors import ProtocolError
from ps.frames import Batch, Rows, dtype_code
from ps.message import VERSION, Command, Entry, Message, Op, decode, encode


def data_msg(request=True):
    a = np.arange(6, dtype=np.float32)
    b = np.arange(3, dtype=np.float16)
    body = [[1, int(Op.PUSH), 3, 0, 6, 6, dtype_code(a.dtype), None],
            [2, int(Op.PULL), 4, 0, 5, 5, 0, None],
            [3, int(Op.PUSH | Op.PULL), 5, 2, 3, 9, dtype_code(b.dtype), None]]
    return Message(Command.DATA, 9, 8, body, [a, b], request=request), a, b


def test_roundtrip_data_zero_copy_views():
    msg, a, b = data_msg()
    out = decode([bytes(memoryview(f)) for f in encode(msg)], route=b"id")
    assert (out.cmd, out.sender, out.recver, out.request, out.route) == (Command.DATA, 9, 8, True, b"id")
    assert len(out.frames) == 2
    np.testing.assert_array_equal(out.frames[0], a)
    assert out.frames[1].dtype == np.float16
    np.testing.assert_array_equal(out.frames[1], b)


def test_roundtrip_control():
    msg = Message(Command.BARRIER, 9, 1, {"group": "workers"})
    out = decode(encode(msg))
    assert out.cmd == Command.BARRIER and out.body == {"group": "workers"} and out.frames == []


def test_reply_error_entry_has_no_frame():
    body = [[7, int(Op.PULL), 3, 0, 0, 6, 0, ["KeyError", "nope"]]]
    out = decode(encode(Message(Command.DATA, 8, 9, body, [], request=False)))
    assert out.body[0][7] == ["KeyError", "nope"] and out.frames == []


def meta(*fields):
    return msgpack.packb(list(fields))


@pytest.mark.parametrize("frames", [
    [],
    [b"\xc1garbage"],
    [meta(VERSION + 1, 0, 9, 8, True, 0, [])],
    [meta(VERSION, 99, 9, 8, True, 0, [])],
    [meta(VERSION, 0, "x", 8, True, 0, [])],
    [meta(VERSION, 0, 9, 8, True, 0, "notalist")],
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 1, 3, 0, 6, 6, 0, None]])],                     # missing frame
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 1, 3, 0, 6, 6, 0, None]]), b"\0" * 23],         # wrong size
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 1, 3, 0, 6, 6, 42, None]]), b"\0" * 24],        # bad dtype code
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 1, 3, 4, 6, 6, 0, None]]), b"\0" * 24],         # off+n > total
    [meta(VERSION, 0, 9, 8, True, 0, []), b"extra"],
    [meta(VERSION, 3, 9, 1, True, 0, {}), b"extra"],
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 33, 3, 0, 1, 1, 0, None, 0]]), b"\0" * 4, b"\0" * 4],   # rows, row_len 0
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 33, 3, 0, 1, 1, 0, None, 2]]), b"\0" * 4],              # no values frame
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 33, 3, 0, 1, 1, 0, None, 2]]), b"\0" * 4, b"\0" * 4],  # 1 value, 2 needed
    [meta(VERSION, 0, 9, 8, True, 0, [[1, 34, 3, 0, 2, 2, 0, None, 2]]), b"\0" * 4],              # 1 id, 2 said
])
def test_malformed_is_protocol_error(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


def test_object_dtype_refused():
    with pytest.raises(TypeError, match="not supported"):
        dtype_code(np.dtype(object))


def test_rows_entries_carry_ids_then_values():
    batch = Batch()
    ids, vals = np.array([4, 9], np.uint32), np.arange(6, dtype=np.float32)
    batch.add(Entry(1, Op.PUSH | Op.ROWS, 3, 0, 2, 2, 0, None, 3), Rows(ids, vals))
    batch.add(Entry(2, Op.PULL | Op.ROWS, 3, 0, 1, 1, 0, None, 3), Rows(np.array([7], np.uint32)))
    assert batch.nbytes == ids.nbytes + vals.nbytes + 4
    out = decode([bytes(memoryview(f)) for f in encode(Message(Command.DATA, 9, 8, batch.entries, batch.frames))])
    push, pull = out.frames
    np.testing.assert_array_equal(push.ids, ids)
    np.testing.assert_array_equal(push.values, vals)
    np.testing.assert_array_equal(pull.ids, [7])
    assert pull.values is None
    assert out.body[0].row_len == 3
