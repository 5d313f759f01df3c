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


def test_a_node_starts_without_modules_it_does_not_use():
    """Every process a launcher starts has the MXNet hook's directory on its path, and every node
    resolves the scheduler's address and imports the optimizers: none of that may pull in
    importlib.abc (with tempfile, typing, ...), the IDNA codec (with stringprep) or ctypes.util
    (which runs ldconfig), ~25 ms of start-up per process for nothing."""
    from ps.mxnet_autoload import MXNET_AUTOLOAD
    root = Path(__file__).resolve().parents[2]
    code = ("import sys, ps.kvstore, ps.server.kvserver, ps.van.zmq_van, ps.optim.numerics as n, numpy as np; "
            "from ps import netutil; netutil.resolve('127.0.0.1'); netutil.resolve('localhost'); "
            "assert n.power(np.float32(2.0), 3) == np.float32(8.0); "
            "bad = {'importlib.abc', 'encodings.idna', 'ctypes.util'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=root,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{MXNET_AUTOLOAD}:{root}"})
