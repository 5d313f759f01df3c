"""A whole cluster in one process, for tests and experiments.

    with local_cluster(num_servers=2, num_workers=2) as c:
        results = c.run(lambda kv: kv.pull(3))   # runs on every worker at once

``van="inproc"`` uses queues, ``van="zmq"`` real sockets on 127.0.0.1. Every wait is
bounded by ``timeout``; on expiry the thread stacks are dumped to stderr.
"""
from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from .config import Config
from .errors import PSTimeoutError
from .kvstore import KVStore
from .scheduler import Scheduler
from .server import KVServer
from .van import create_van


class LocalCluster:
    def __init__(self, scheduler: Scheduler, servers: list[KVServer], workers: list[KVStore], timeout: float):
        self.scheduler = scheduler
        self.servers = servers
        self.workers = workers
        self.timeout = timeout
        self.port = scheduler.port

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> list[Any]:
        """Call ``fn(kv, *args)`` on every worker concurrently; return results by rank."""
        return _parallel([lambda kv=kv: fn(kv, *args) for kv in self.workers], timeout or self.timeout,
                         f"{getattr(fn, '__name__', 'fn')} on {len(self.workers)} workers")


def _parallel(calls: list[Callable[[], Any]], timeout: float, what: str) -> list[Any]:
    pool = ThreadPoolExecutor(max_workers=max(1, len(calls)), thread_name_prefix="ps-test")
    try:
        futures = [pool.submit(c) for c in calls]
        results = []
        for f in futures:
            try:
                results.append(f.result(timeout=timeout))
            except TimeoutError:
                faulthandler.dump_traceback(sys.stderr)
                raise PSTimeoutError(f"{what} did not finish within {timeout:g}s") from None
        return results
    finally:
        pool.shutdown(wait=False)


@contextlib.contextmanager
def local_cluster(num_servers: int = 1, num_workers: int = 2, van: str = "inproc", type: str = "dist_sync",
                  timeout: float = 30.0, worker_settings: list[dict[str, Any]] | None = None,
                  **settings: Any) -> Iterator[LocalCluster]:
    """Start a scheduler, servers and workers in this process; stop them all on exit.

    ``settings`` are Config fields (e.g. ``bigarray_bound=10``) applied to every node;
    ``worker_settings[r]`` overrides some for worker r.
    """
    base = dict(root_uri="127.0.0.1", num_servers=num_servers, num_workers=num_workers,
                connect_timeout=timeout, heartbeat_interval=0.5, heartbeat_timeout=max(timeout, 5.0))
    base.update(settings)
    scheduler = Scheduler(Config(role="scheduler", root_port=0, **base), van=create_van(van))
    port = scheduler.start()
    threads = [threading.Thread(target=scheduler.run, name="ps-test-scheduler", daemon=True)]
    servers = [KVServer(Config(role="server", root_port=port, rank_hint=r, **base), van=create_van(van))
               for r in range(num_servers)]
    threads += [threading.Thread(target=s.run, name=f"ps-test-server{r}", daemon=True)
                for r, s in enumerate(servers)]
    for t in threads:
        t.start()
    workers: list[KVStore] = []
    try:
        extra = worker_settings or [{}] * num_workers
        cfgs = [Config(role="worker", root_port=port, rank_hint=r, **{**base, **extra[r]}) for r in range(num_workers)]
        workers = _parallel([lambda c=c: KVStore(type, config=c, van=create_van(van)) for c in cfgs],
                            timeout + 5, "workers joining")
        yield LocalCluster(scheduler, servers, workers, timeout)
    finally:
        if workers:
            _parallel([kv.close for kv in workers], timeout, "workers closing")
        else:
            scheduler.close()
        for t in threads:
            t.join(timeout)
        for s in servers:
            s.stop()
        scheduler.close()
