"""``horovod.torch.mpi_ops``: where Horovod defines its collectives; here they are ps.torch's."""
from ps.torch import *  # noqa: F401,F403
