"""``horovod.torch.elastic.state``, where Horovod defines ``TorchState``."""
from ps.torch.elastic import TorchState  # noqa: F401
