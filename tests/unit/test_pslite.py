"""A native MXNet node's first message (ps-lite's protobuf) is recognized and named."""
import msgpack
import pytest

from ps.errors import NativeNodeError, ProtocolError
from ps.message import Command, Message, decode, encode
from ps.pslite import native_node

# The first message MXNet 1.9.1's C++ kvstore sends its scheduler (ADD_NODE), as captured from
# `DMLC_ROLE=worker python -c "import mxnet as mx; mx.kv.create('dist_sync')"` on this machine:
# PBMeta{head: kEmpty, control: {cmd: ADD_NODE, node: [{role: WORKER, hostname: 192.0.2.2, port: 35023}]}}
WORKER_ADD_NODE = (b"\x08\xff\xff\xff\xff\x07\x1a\x1f\x08\x02\x12\x1b\x08\x01\x10\xff\xff\xff\xff\x07\x1a\t"
                   b"192.0.2.2 \xcf\x91\x02(\x00P\x00 \x00(\x000\x00@\x00P\xff\xff\xff\xff\x07`\x00h\x00")
SERVER_ADD_NODE = WORKER_ADD_NODE.replace(b"\x12\x1b\x08\x01", b"\x12\x1b\x08\x00")


def test_a_native_worker_is_named_with_its_address_and_the_fix():
    err = native_node(WORKER_ADD_NODE)
    assert isinstance(err, NativeNodeError)
    assert (err.role, err.host, err.port) == ("worker", "192.0.2.2", 35023)
    assert "native MXNet kvstore worker at 192.0.2.2:35023" in str(err)
    assert "python -m ps.launch" in str(err) and "import ps.mxnet" in str(err)
    assert native_node(SERVER_ADD_NODE).role == "server"


def test_decode_raises_it_instead_of_a_plain_protocol_error():
    with pytest.raises(NativeNodeError, match="native MXNet kvstore worker"):
        decode([WORKER_ADD_NODE])


@pytest.mark.parametrize("frame", [b"", b"\x08", b"\x08\x01\x1a\xff", b"garbage", b"\x08\x01",
                                   msgpack.packb([1, 2, 3])])
def test_other_bytes_are_not_taken_for_ps_lite(frame):
    assert native_node(frame) is None
    with pytest.raises(ProtocolError) as info:
        decode([frame])
    assert not isinstance(info.value, NativeNodeError)


def test_ps_messages_still_decode():
    msg = decode(encode(Message(Command.BARRIER, 9, 1, {"group": "workers"})))
    assert msg.body == {"group": "workers"}
