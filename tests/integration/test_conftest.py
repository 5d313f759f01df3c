"""The checks of tests/conftest.py: a test that leaves a thread or process running fails, and so\ndoes a fast-tier test (no ``process`` marker) that starts a process or opens a socket."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.process


LEAKY = textwrap.dedent('''
    import subprocess, threading, time
    import pytest

    pytestmark = pytest.mark.process

    def test_leaves_a_thread():
        threading.Thread(target=time.sleep, args=(30,), name="ps-van[leak]", daemon=True).start()

    def test_leaves_a_process():
        subprocess.Popen(["sleep", "60"])

    def test_cleans_up():
        t = threading.Thread(target=time.sleep, args=(0.2,), name="ps-van[short]", daemon=True)
        t.start()
''')


def test_a_leaked_thread_or_process_fails_its_test(tmp_path):
    path = tmp_path / "test_leaky.py"
    path.write_text(LEAKY)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(path)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TESTS_LEAK_GRACE": "1"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "test_leaves_a_thread left running" in out and "ps-van[leak]" in out, out
    assert "test_leaves_a_process left running" in out and "sleep 60" in out, out
    assert "2 errors" in out or "2 failed" in out, out        # the clean test passes


IMPURE = textwrap.dedent('''
    import socket, subprocess
    import pytest
    import zmq

    def test_starts_a_process():
        subprocess.run(["true"], check=True)

    def test_binds_a_socket():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))

    def test_connects_a_zmq_socket():
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.connect("tcp://127.0.0.1:9")
        finally:
            sock.close(linger=0)
            ctx.term()

    def test_pure():
        assert sum(range(4)) == 6

    @pytest.mark.process
    def test_marked_may_start_a_process():
        subprocess.run(["true"], check=True)
''')


def test_a_fast_tier_test_that_starts_a_process_or_opens_a_socket_fails_naming_it(tmp_path):
    path = tmp_path / "test_impure.py"
    path.write_text(IMPURE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), "-W", "ignore::pytest.PytestUnknownMarkWarning", str(path)],
                         cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "test_starts_a_process starts a process, but it is in the fast tier" in out, out
    assert "test_binds_a_socket binds a socket, but it is in the fast tier" in out, out
    assert "test_connects_a_zmq_socket connects a zmq socket, but it is in the fast tier" in out, out
    assert "3 failed, 2 passed" in out, out


def test_the_files_that_share_the_machine_exist():
    """A renamed file would leave ONE_AT_A_TIME silently, and run beside the others."""
    from tests.conftest import ONE_AT_A_TIME
    missing = [name for name in ONE_AT_A_TIME if not (ROOT / name).is_file()]
    assert not missing, missing


CRASHING = textwrap.dedent('''
    import os
    import pytest

    @pytest.mark.parametrize("n", range(24))
    def test_one(n):
        if n == 20:
            os._exit(1)              # a segfault in a C extension looks like this to xdist
''')


def test_a_crashed_xdist_worker_fails_its_test_and_the_run_still_ends(tmp_path):
    """xdist 3.8's own scope scheduler can wait forever after a worker dies near the end of
    a run (the CI run that timed out); ours reports the crash once and runs the rest."""
    path = tmp_path / "test_crashing.py"
    path.write_text(CRASHING)
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.conftest",
                            "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(path)],
                           cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        out, _ = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, 9)                  # the run and its xdist workers
        out, _ = run.communicate()
        pytest.fail(f"the xdist run did not end within 60 s of a worker's crash:\n{out}")
    assert run.returncode == 1, out
    assert "test_one[20]" in out and "1 failed, 23 passed" in out, out
