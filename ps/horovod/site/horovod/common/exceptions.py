"""Horovod's exceptions, for scripts that catch them by their Horovod names."""
from ps.errors import CollectiveError as HorovodInternalError  # noqa: F401 - what ps's collectives raise


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal to an elastic job that hosts came or went. ps never raises it (its job
    keeps a fixed set of workers); it is here so that ``except HostsUpdatedInterrupt`` in an
    elastic script works. ``skip_sync``: the state need not be synced again after the reset."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
