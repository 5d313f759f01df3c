"""ps/server/malloc.py: a server's malloc keeps the memory of a round's freed buffers, so the
next round takes no page faults for them (counted in a fresh process: the setting is for
the whole process)."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process

ROUNDS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from ps.server.malloc import keep_freed
    print(keep_freed(int(sys.argv[1])))

    def one_round():            # four 1 MiB pushes read into fresh buffers, summed, freed
        pushes = [np.empty(1 << 20, np.uint8) for _ in range(4)]
        for p in pushes:
            p[:] = 1
        total = pushes[0].astype(np.float32)
        del pushes, total
    one_round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        one_round()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(keep: int) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", ROUNDS, str(keep)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_round_buffers_are_reused_without_page_faults():
    kept, faults_kept = _faults(64 << 20)
    plain, faults_plain = _faults(0)
    assert kept and not plain
    # 20 rounds of 8 MiB touched: about 40k faults when malloc gives the memory back each round
    assert faults_plain > 10_000, faults_plain
    assert faults_kept < faults_plain / 20, (faults_kept, faults_plain)
