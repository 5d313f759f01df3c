"""What a fresh interpreter imports, as a user's script would start one."""
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process


def test_modules_do_not_import_mxnet():
    code = ("import sys, ps.optim, ps.optim.lr_scheduler, ps.optim.from_mxnet, ps.optim.pickled; "
            "assert 'mxnet' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
