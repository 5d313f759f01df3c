"""How a reduction's key carries its op and scaling (names.variant), and how a deadlock's
MismatchError names a key (names.described)."""
import numpy as np

from ps.collective.names import described, label, tensor_key, timeline_bar, variant


def test_the_default_reduction_keeps_its_plain_key_and_every_other_gets_its_own():
    assert variant("Average") == ""
    keys = {variant(op, pre, post) for op in ("Average", "Sum", "Min") for pre in (1.0, 0.5) for post in (1.0, 2.0)}
    assert len(keys) == 12              # ranks that reduce differently never share a round


def test_a_key_reads_back_as_the_script_wrote_it():
    key = tensor_key("allreduce.w" + variant("Sum", 0.5), (3, 4), np.float32)
    assert described(key) == "allreduce of 'w' (shape (3, 4), float32, sum, pre0.5)"
    assert label(key) == "'w' (allreduce)"
    assert timeline_bar(key, "ps.torch").row == "allreduce.w"
    assert described("set2/" + tensor_key("hvd.allreduce.grad.fc", (2,), np.float64), "hvd.") == \
        "the gradient of 'fc' (shape (2,), float64) in process set 2"
    assert described(tensor_key("allreduce.broadcast.b", (1,), np.int32)) == "broadcast of 'b' (shape (1,), int32)"
    assert described("plain") == "'plain'"
