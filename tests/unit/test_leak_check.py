"""The leak check of tests/conftest.py fails a test that leaves a thread or process running."""
import os
import subprocess
import sys
import textwrap

from tests.helpers import ROOT

LEAKY = textwrap.dedent('''
    import subprocess, threading, time

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
