"""The scheduler's word while a cluster forms (ps/formation.py): a rank that never comes is
named within seconds, long before PS_CONNECT_TIMEOUT ends the wait."""
from ps.config import Config
from ps.formation import FIRST_REPORT, Formation
from ps.membership import Member
from ps.message import Role


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def forming(workers: int, timeout: float) -> tuple[Formation, Clock]:
    env = {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
           "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": "1", "PS_CONNECT_TIMEOUT": str(timeout)}
    clock = Clock()
    replies = []
    f = Formation(Config.from_env(env), van=None, clock=clock, reply=lambda *a: replies.append(a),
                  on_connection=lambda *a: None)
    f.begin()
    return f, clock


def test_a_missing_rank_is_named_at_5_10_20_seconds_then_the_timeout_takes_over():
    f, clock = forming(3, 60)
    for rank in (0, 2):          # in-process addresses: no connection watch
        assert f.register(Member(Role.WORKER, "h", 9000 + rank, f"inproc://w{rank}", rank_hint=rank))
    assert f.register(Member(Role.SERVER, "h", 9100, "inproc://s0", rank_hint=0))
    said = []
    for t in range(0, 70):
        clock.now = 100.0 + t
        line = f.still_forming(clock.now)
        if line:
            said.append((t, line))
    assert [t for t, _ in said] == [5, 10, 20, 40], said
    assert FIRST_REPORT == 5.0
    assert said[0][1] == ("the cluster has not formed after 5s: have 2/3 workers (missing rank 1), 1/1 servers. "
                          "Waiting up to 60s (PS_CONNECT_TIMEOUT)")
    assert f.late(100.0 + 61).startswith("the cluster did not form within 60s (PS_CONNECT_TIMEOUT): have 2/3 workers")
