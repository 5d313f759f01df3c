"""``horovod.mxnet`` is ps.mxnet's Horovod API (``import ps.mxnet as hvd``; docs/torch.md, "MXNet")."""
from ps.mxnet import *  # noqa: F401,F403
from ps.mxnet import __all__  # noqa: F401
