"""A name taken by a call still in flight (ps/torch/sums.py ``claim``), without a cluster:
Horovod refuses a second call of the name until the first is synchronized or its background
cycle ran; a ps call may be answered before the script's next line, so an unsynchronized
call keeps its name for ``CYCLE`` at least."""
import time

import pytest

pytest.importorskip("torch")

from ps.torch import sums  # noqa: E402


class Fake:
    def __init__(self, done=False, waited=False):
        self._done, self.waited = done, waited

    def done(self):
        return self._done


def test_a_name_is_taken_until_done_and_for_a_cycle_unless_synchronized():
    table = sums.InFlight()
    table.add(("allreduce", "a"), Fake(done=False))
    table.add(("allreduce", "b"), Fake(done=True))                 # answered already, not synchronized
    table.add(("allreduce", "c"), Fake(done=True, waited=True))    # a blocking call, or synchronized
    assert table.busy(("allreduce", "a")) and table.busy(("allreduce", "b"))
    assert not table.busy(("allreduce", "c")) and not table.busy(("allreduce", "d"))
    time.sleep(sums.CYCLE * 2)
    assert table.busy(("allreduce", "a")) and not table.busy(("allreduce", "b"))


def test_claim_names_the_call_in_flight():
    sums.hold("allreduce", "twice", Fake(done=True))
    with pytest.raises(ValueError, match="allreduce of 'twice': an operation of that name is still in flight"):
        sums.claim("allreduce", "twice")
