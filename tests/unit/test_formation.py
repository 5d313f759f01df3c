"""The scheduler's word while a cluster forms (ps/formation.py): a rank that never comes is
named within seconds, long before PS_CONNECT_TIMEOUT ends the wait."""
from ps.config import Config
from ps.formation import FIRST_REPORT, Formation
from ps.membership import Member, Terms
from ps.message import Role
from tests.helpers import Clock


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


def test_workers_that_cut_keys_differently_are_refused_at_formation_naming_both_sizes():
    """PS_CHUNK_BYTES: a server sums the same chunk of every worker, so workers that cut a key
    in different chunks could never close a round; the job does not form, and says why."""
    f, clock = forming(2, 60)
    assert f.register(Member(Role.WORKER, "h", 9000, "inproc://w0", rank_hint=0, chunk=1 << 20))
    assert f.register(Member(Role.WORKER, "h", 9001, "inproc://w1", rank_hint=1, chunk=256 << 10))
    assert f.register(Member(Role.SERVER, "h", 9100, "inproc://s0", rank_hint=0))
    why = f.form(clock.now)
    assert why == ("workers disagree on PS_CHUNK_BYTES (262144 at inproc://w1; 1048576 at inproc://w0): a server "
                   "sums the same chunks of every worker; set the same value on every worker"), why
    same, clock = forming(2, 60)
    for rank in (0, 1):
        assert same.register(Member(Role.WORKER, "h", 9000 + rank, f"inproc://w{rank}", rank_hint=rank,
                                    chunk=256 << 10))
    assert same.register(Member(Role.SERVER, "h", 9100, "inproc://s0", rank_hint=0))
    formed = same.form(clock.now)
    assert not isinstance(formed, str), formed
    assert formed.terms == Terms(True, 256 << 10)


def test_a_registration_says_its_chunk_size_and_an_older_one_that_does_not_is_taken_as_before():
    body = {"role": int(Role.WORKER), "host": "h", "port": 1, "addr": "tcp://h:1", "chunk": 65536}
    assert Member.from_registration(body, None).chunk == 65536
    del body["chunk"]
    assert Member.from_registration(body, None).chunk == 0
