"""The scheduler's side of PS_DEADLOCK_CHECK (ps/waitjudge.py): when it decides, and the
order it carries a verdict out in (servers drop their rounds first, then the workers hear)."""
from ps.message import Command
from ps.waitjudge import ACK_WAIT, WaitJudge
from ps.waits import Awaited, Report

SERVERS, WORKERS = [8, 10], [9, 11]


class Cluster:
    def __init__(self):
        self.now = 0.0
        self.sent = []
        self.forgotten = []
        self.workers = list(WORKERS)
        self.judge = WaitJudge(lambda: self.now, 1.0, lambda: self.workers, lambda: SERVERS,
                               lambda node, cmd, body, request=False: self.sent.append((node, cmd, body)),
                               self.forgotten.append)

    def report(self, node, rank, key, seq, pushes, version=5, episode=1):
        self.judge.report(node, Report(rank, episode, version, (Awaited(key, seq, f"key {key}"),), pushes).to_body())


def deadlock(c, version_later=5):
    c.report(9, 0, 1, 2, {1: 2})
    c.report(11, 1, 2, 1, {1: 1, 2: 1})
    c.now += 1.0
    c.report(9, 0, 1, 2, {1: 2})
    c.report(11, 1, 2, 1, {1: 1, 2: 1}, version=version_later)


def test_a_verdict_needs_every_worker_reported_twice_without_pushing_meanwhile():
    c = Cluster()
    deadlock(c, version_later=6)            # rank 1 pushed between its reports: it may be moving
    assert c.sent == []
    c.now += 1.0
    c.report(11, 1, 2, 1, {1: 1, 2: 1}, version=6)
    assert [(n, cmd) for n, cmd, _ in c.sent] == [(8, Command.DROP_ROUNDS), (10, Command.DROP_ROUNDS)]


def test_servers_drop_their_rounds_before_any_worker_hears_the_verdict():
    c = Cluster()
    deadlock(c)
    number = c.sent[0][2]["verdict"]
    c.sent.clear()
    c.judge.dropped(8, {"verdict": number, "closed": [[1, 1], [2, 0]]})
    assert c.sent == []                                  # server 10 has not answered
    c.judge.dropped(10, {"verdict": number, "closed": [[1, 1]]})
    assert [n for n, cmd, _ in c.sent if cmd == Command.BLOCKED] == WORKERS
    body = c.sent[0][2]
    assert sorted(map(tuple, body["closed"])) == [(1, 1), (2, 0)]
    assert "rank 0 waits for key 1, which rank 1 did not start" in body["verdict"]
    assert c.forgotten == ["workers"] and c.judge.verdicts == 1


def test_a_worker_not_blocked_a_spell_that_ended_or_a_silent_server_are_handled():
    c = Cluster()
    c.workers = [9, 11, 13]
    deadlock(c)
    assert c.sent == []                                  # worker 13 computes: it may yet push
    c = Cluster()
    c.report(9, 0, 1, 2, {1: 2})
    c.report(11, 1, 2, 1, {1: 1, 2: 1})
    c.judge.report(9, {"rank": 0, "episode": 1, "over": True})   # rank 0's wait ended
    c.now += 1.0
    c.report(11, 1, 2, 1, {1: 1, 2: 1})
    assert c.sent == []
    c = Cluster()
    deadlock(c)
    c.sent.clear()
    c.judge.tick(c.now + ACK_WAIT + 1)                   # the servers never answer: told anyway
    assert [n for n, cmd, _ in c.sent if cmd == Command.BLOCKED] == WORKERS


def test_workers_that_all_raised_a_checks_mismatch_are_realigned_without_a_verdict_text():
    c = Cluster()
    c.judge.report(9, {"rank": 0, "reset": 1})
    assert c.sent == []
    c.judge.report(11, {"rank": 1, "reset": 1})
    number = c.sent[0][2]["verdict"]
    c.sent.clear()
    for server in SERVERS:
        c.judge.dropped(server, {"verdict": number, "closed": []})
    assert [(n, body["verdict"]) for n, _, body in c.sent] == [(9, None), (11, None)]
    assert c.judge.verdicts == 0


def test_a_process_sets_members_are_realigned_alone_and_only_its_keys_rounds_dropped():
    c = Cluster()
    c.workers = [9, 11, 13]                                  # rank 2 (node 13) is in no set
    c.judge.report(9, {"rank": 0, "reset": 1, "members": [0, 1]})
    assert c.sent == []
    c.judge.report(11, {"rank": 1, "reset": 1, "members": [0, 1]})
    (drop, _) = [body for _, cmd, body in c.sent if cmd == Command.DROP_ROUNDS]
    assert drop["members"] == [0, 1]
    c.sent.clear()
    for server in SERVERS:
        c.judge.dropped(server, {"verdict": drop["verdict"], "closed": []})
    assert [n for n, cmd, _ in c.sent if cmd == Command.BLOCKED] == [9, 11]
    assert c.forgotten == []                                 # rank 2 may be at a barrier: left alone
