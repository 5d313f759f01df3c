"""The server half of a joint process (``DMLC_ROLE=joint``): a worker that holds its own shard.

MXNet's ``dist_sync_mpi`` proposal and BytePS's joint role answer the same complaint: a
server:worker ratio has to be worked out per model and network, and separate server
processes are one more thing to deploy. A joint process is one worker and one server of the
job. The server is the same :class:`ps.server.KVServer` that ``python -m ps`` runs, with a
Postoffice of its own, on threads of this process; the scheduler sees a server and a worker
as always. The worker's messages to it go through ZeroMQ's inproc transport
(ps/van/zmq_van.py), not a socket.

This is the one module besides the entry points that starts a server; the worker's store
(ps/kvstore.py) imports it only in a joint process.
"""
from __future__ import annotations

import logging
import threading

from .config import Config
from .errors import PSError
from .server import KVServer

logger = logging.getLogger(__name__)


class JointServer:
    """This process's server shard, serving on its own thread until the job ends.

    Started before the worker's Postoffice registers, since the cluster forms only once every
    server registered too, and the worker's start blocks until it has.
    """

    def __init__(self, config: Config):
        self.server = KVServer(config.replace(role="server", in_process_peers=True))
        self.code: int | None = None
        self._thread = threading.Thread(target=self._run, name="ps-joint-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.code = self.server.run()
        except BaseException as exc:  # noqa: BLE001 - a thread's error must reach the log
            logger.exception("the server of this joint process failed: %s", exc)
            self.code = 1

    @property
    def error(self) -> PSError | None:
        return self.server.error

    def stop(self) -> None:
        """The worker could not join: end the server without waiting for the job's end."""
        self.server.stop()

    def wait(self, timeout: float) -> bool:
        """Until the server ended (the scheduler ends servers once every worker closed); False
        after ``timeout`` seconds, the server then stopped."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the server of this joint process did not end within %gs of its worker's close "
                           "(the scheduler ends servers once every worker closed): stopping it", timeout)
            self.server.stop()
            self._thread.join(5.0)
            return False
        return True
