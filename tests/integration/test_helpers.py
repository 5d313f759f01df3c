"""The shared test helpers: a helper that loses a process's output makes tests fail at random."""
import pytest

from tests.helpers import PYTHON, read_until

pytestmark = pytest.mark.process


def test_read_until_keeps_what_it_read_past_the_line_it_matched(procs):
    """Lines written together arrive in one read; the next read_until and finish() get the rest."""
    proc = procs.start([PYTHON, "-c", "print('a\\nb\\nc', flush=True); import time; time.sleep(0.5)"], {})
    assert read_until(proc, lambda line: line == "a", 10, "line a") == "a"
    assert read_until(proc, lambda line: line == "b", 10, "line b") == "b"
    code, out, _ = procs.finish(proc, timeout=10)
    assert (code, out) == (0, "c\n")
