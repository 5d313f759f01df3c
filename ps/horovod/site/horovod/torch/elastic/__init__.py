"""``horovod.torch.elastic``: ps.torch's ``run``, ``TorchState`` and ``ElasticSampler``, which run an
elastic script on a fixed set of workers (docs/torch.md)."""
from ps.torch.elastic import *  # noqa: F401,F403
from ps.torch.elastic import __all__  # noqa: F401
