"""The suite's xdist scheduler: xdist's load-scope scheduling with every test its own unit of
work except the files that must run one at a time (one unit, one worker), and with a crashed
worker handled so the run still ends.

xdist 3.8's LoadScopeScheduling, when a worker dies (a segfault in a C extension, a hard
timeout), puts the worker's whole history back on the queue: its finished units come back
as empty ones, each of which uses up a surviving worker's chance to be given more work, and
near the end of a run that leaves every worker idle and the session waiting forever
(pytest-xdist issues 1323, 1327, 1378). It also runs the test that crashed again, which a
deterministic crash repeats until the restarts run out. Here only unfinished units go back,
without the test that crashed (already reported as failed), and a worker is topped up until
it holds more than two tests, so a fresh worker never sits on a single test it cannot start
(a worker runs a test only once it knows the next one, or is told to stop).
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling


class OneAtATime(LoadScopeScheduling):
    one_at_a_time: tuple[str, ...] = ()

    def _split_scope(self, nodeid: str) -> str:
        return "one-at-a-time" if nodeid.split("::", 1)[0] in self.one_at_a_time else nodeid

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [(scope, nodeid) for scope, unit in workload.items()
                   for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        scope, crashed = pending[0]
        workload[scope][crashed] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        while self.workqueue and self._pending_of(self.assigned_work.get(node, {})) <= 2:
            self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()


def make(config, log, one_at_a_time: tuple[str, ...]) -> OneAtATime:
    scheduler = OneAtATime(config, log)
    scheduler.one_at_a_time = one_at_a_time
    return scheduler
