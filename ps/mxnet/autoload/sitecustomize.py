"""Zero-edit MXNet scripts: MXNet's ``dist_*`` kvstores run on ps without ``import ps``.

``python -m ps.launch`` puts this directory first on its processes' ``PYTHONPATH``
(``PS_MXNET_AUTOLOAD=0`` turns that off); by hand, ``export PYTHONPATH=$(python -m ps
--mxnet-autoload-path)``. Python then imports this ``sitecustomize`` at start-up. It only
installs an import hook, so a process that never imports mxnet pays nothing more: when the
script imports ``mxnet``, the hook lets mxnet load, then imports ``ps.mxnet`` (in a worker),
which registers ps's ``dist_sync``, ``dist_async``, ... with MXNet. A ``sitecustomize`` that
this one shadows (the Python installation's own) still runs.
"""
import atexit
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PS_FINAL_EXIT_STATUS = True     # ps.mxnet leaves its exit status check to _final_exit_status


class _ThenPs:
    """mxnet's own loader, then ps.mxnet. (Not an ``importlib.abc.Loader``: importing
    importlib.abc costs every process that starts ~13 ms, with tempfile, typing and more,
    and the import system needs only the two methods.)"""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        role = _role()
        if role not in ("worker", "joint", None):
            # MXNet's own import would start its C++ server or scheduler here: ps's role runs
            # instead and the process exits, as with `import ps.mxnet` first in the script
            import ps.mxnet  # noqa: F401
        if role == "joint":         # a worker to MXNet, which would start its C++ server for "joint"
            os.environ["DMLC_ROLE"] = "worker"
        try:
            self.inner.exec_module(module)
        finally:
            if role == "joint":
                os.environ["DMLC_ROLE"] = "joint"
        if role in ("worker", "joint"):
            _register_ps()


class _MXNetHook:
    done = False

    def find_spec(self, name, path=None, target=None):
        if name != "mxnet" or self.done:
            return None
        self.done = True                         # once; and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPs(spec.loader)
        return spec


def _role():
    """DMLC_ROLE as ps reads it; None if ps cannot be imported or the value is bad."""
    try:
        from ps.config import role_from_env
        return role_from_env()
    except Exception as exc:  # noqa: BLE001 - say why, and leave the script to MXNet
        sys.stderr.write(f"ps: MXNet's kvstores stay MXNet's own: {type(exc).__name__}: {exc}\n")
        return None


def _register_ps():
    try:
        import ps.mxnet  # noqa: F401 - registers ps's dist_* kvstores with MXNet
    except Exception as exc:  # noqa: BLE001 - say why, and leave the script to MXNet
        sys.stderr.write(f"ps: could not put MXNet's dist_* kvstores on ps: {type(exc).__name__}: {exc}\n")


def _final_exit_status():
    """Registered at start-up, so it runs after every other exit handler (a DataLoader's
    pool, MXNet's shutdown, the script's own): ps.mxnet's check, which may end the process
    with status 1, skips none of them."""
    hooks = sys.modules.get("ps.mxnet.hooks")
    if hooks is not None:
        hooks.exit_status()


def _run_shadowed_sitecustomize():
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if not any(isinstance(f, _MXNetHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _MXNetHook())
    atexit.register(_final_exit_status)
_run_shadowed_sitecustomize()
