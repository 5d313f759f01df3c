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


def test_import_ps_torch_leaves_torch_dynamo_until_a_table_is_used():
    """torch._dynamo costs a second of CPU to import; only ps.torch's embedding tables
    (torch.compiler.disable) need it."""
    pytest.importorskip("torch")
    code = ("import sys, ps.torch as hvd; assert 'torch._dynamo' not in sys.modules, 'imported at once'; "
            "hvd.EmbeddingBag; from ps.torch import Embedding; "
            "assert hvd.embedding.Embedding is Embedding and 'torch._dynamo' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
