"""How a job ends, as the scheduler runs it: each worker closes its store (CLOSE), the
servers learn it (WORKER_CLOSED: rounds that miss its pushes fail instead of waiting),
and when the last worker has closed the servers are told to stop (TERMINATE) and the job
ends 0 with the last one's acknowledgement, or TERMINATE_GRACE later without it.
"""
from __future__ import annotations

import logging
from typing import Callable, Container

from .message import Command, node_name

# the scheduler's own lines, under its name (operators grep for it)
logger = logging.getLogger("ps.scheduler")

TERMINATE_GRACE = 10.0   # seconds servers get to acknowledge the end of the job


class Ending:
    """Closed workers and stopped servers (under the scheduler's lock)."""

    def __init__(self, clock: Callable[[], float], num_workers: int, rank: Callable[[int], int],
                 server_ids: Callable[[], list[int]], send: Callable[..., None], finish: Callable[[int], None]):
        """``rank(id)`` of a node; ``server_ids()``; ``send(id, cmd, body=None, request=False)``;
        ``finish(0)`` ends the job."""
        self.clock = clock
        self.num_workers = num_workers
        self._rank = rank
        self._server_ids = server_ids
        self._send = send
        self._finish = finish
        self.closed_workers: set[int] = set()
        self.terminated: set[int] = set()       # servers that acknowledged TERMINATE (or died after it)
        self.terminate_sent_at: float | None = None

    def gone(self, node_id: int) -> bool:
        """Left on purpose: a closed worker or a server that acknowledged TERMINATE."""
        return node_id in self.closed_workers or node_id in self.terminated

    def close_worker(self, node_id: int) -> None:
        """The servers learn it first: a worker whose CLOSE is acknowledged may exit at once."""
        self.closed_workers.add(node_id)
        for sid in self._server_ids():
            self._send(sid, Command.WORKER_CLOSED, {"rank": self._rank(node_id), "id": node_id})
        self._send(node_id, Command.CLOSE)

    def maybe_terminate(self) -> None:
        if len(self.closed_workers) == self.num_workers and self.terminate_sent_at is None:
            logger.info("scheduler: every worker closed; stopping the servers")
            self.terminate_sent_at = self.clock()
            for sid in self._server_ids():
                self._send(sid, Command.TERMINATE, request=True)

    def server_ended(self, node_id: int) -> None:
        """A server is done (acknowledged TERMINATE, or died after it): the job ends 0 with the last."""
        self.terminated.add(node_id)
        if set(self._server_ids()) <= self.terminated:
            self._finish(0)

    def overdue(self, now: float) -> bool:
        """TERMINATE_GRACE passed without every server's acknowledgement: the job ends 0 anyway."""
        if self.terminate_sent_at is None or now - self.terminate_sent_at <= TERMINATE_GRACE:
            return False
        missing = [node_name(i) for i in self._server_ids() if i not in self.terminated]
        logger.warning("servers %s did not acknowledge the end of the job", ", ".join(missing))
        self._finish(0)
        return True

    def report(self, node_id: int, closed_workers: list[int], closed: bool, known: Container[int]) -> None:
        """A live node's report to a restarted scheduler: the workers it knows closed, and
        (a worker) whether it closed itself, its CLOSE perhaps lost with the old scheduler."""
        self.closed_workers.update(i for i in closed_workers if i in known)
        if closed:
            self.close_worker(node_id)
        self.maybe_terminate()
