"""``horovod.torch`` is ``ps.torch`` (docs/torch.md has the call-by-call table)."""
from ps.torch import *  # noqa: F401,F403
from ps.torch import __all__  # noqa: F401

from . import elastic  # noqa: E402,F401 - as Horovod's: hvd.elastic is this package's
