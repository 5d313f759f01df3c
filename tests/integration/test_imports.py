"""What a fresh interpreter imports, as a user's script would start one."""
import os
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


@pytest.mark.parametrize("resend", ["0", "1"])
def test_the_launcher_and_its_scheduler_run_a_job_without_numpy(resend):
    """The scheduler carries no arrays, so neither it nor the launcher it runs in imports numpy
    (~0.1 s of CPU and ~26 MB in every launcher and every scheduler pod); the worker's and the
    server's first DATA message imports it where it is needed. A whole job: formation,
    a push and a pull, the barrier at close, the end; also with PS_RESEND's van, which copies
    what it sends."""
    root = Path(__file__).resolve().parents[2]
    worker = ("import numpy as np, ps; kv = ps.KVStore('dist_sync'); kv.init(3, np.ones(4, np.float32)); "
              "kv.push(3, np.full(4, 2, np.float32)); got = kv.pull(3); kv.close(); "
              "assert got.tolist() == [2.0] * 4, got; print('pulled', got.tolist())")
    launcher = ("import atexit, runpy, sys; "
                "atexit.register(lambda: print('launcher imported numpy:', 'numpy' in sys.modules)); "
                f"sys.argv = ['ps.launch', '-n', '1', '-s', '1', sys.executable, '-c', {worker!r}]; "
                "runpy.run_module('ps.launch', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=90,
                         cwd=root, check=False, env={**os.environ, "PS_RESEND": resend})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pulled [2.0, 2.0, 2.0, 2.0]" in out.stdout, out.stdout + out.stderr
    assert "launcher imported numpy: False" in out.stdout, out.stdout + out.stderr
