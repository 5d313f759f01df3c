"""The scheduler's pure rules in ps/membership.py: how a job counts its nodes, which dead
node a restart replaces, and whether a death can be recovered from."""
from ps.membership import (Member, Recovery, Terms, agreed_terms, breaks_terms, head_count, node_state, restart_place,
                           unrecoverable)
from ps.message import Role, server_id, worker_id


def member(role, rank, host="h1", hint=None):
    m = Member(role, host, 9000 + rank, f"tcp://{host}:{9000 + rank}", rank_hint=hint, hostname=host)
    m.rank = rank
    return m


def test_head_count_counts_each_role_against_what_the_job_expects():
    nodes = [member(Role.WORKER, 0), member(Role.SERVER, 0), member(Role.WORKER, 1)]
    assert head_count(nodes, 3, 2) == "have 2/3 workers, 1/2 servers"


def test_head_count_names_the_missing_ranks_when_every_node_asked_for_one():
    """mpirun's and every launcher's processes ask for their rank (DMLC_RANK): the formation
    timeout then names the rank that never came, e.g. an mpirun rank that exited early."""
    nodes = [member(Role.WORKER, 0, hint=0), member(Role.SERVER, 0, hint=0), member(Role.WORKER, 2, hint=2)]
    assert head_count(nodes, 4, 4) == ("have 2/4 workers (missing ranks 1, 3), "
                                       "1/4 servers (missing ranks 1, 2, 3)")
    unhinted = [member(Role.WORKER, 0, hint=0), member(Role.WORKER, 1)]
    assert head_count(unhinted, 3, 1) == "have 2/3 workers, 0/1 servers"


def test_a_member_is_described_by_role_rank_id_and_address():
    assert member(Role.WORKER, 1, "10.0.0.2").describe(worker_id(1)) == "worker 1 (W[11] at 10.0.0.2:9001)"


def test_a_restart_takes_the_rank_it_asks_for_else_its_hosts_else_the_first():
    nodes = {worker_id(0): member(Role.WORKER, 0, "a"), worker_id(1): member(Role.WORKER, 1, "b")}
    free = [worker_id(0), worker_id(1)]
    assert restart_place(member(Role.WORKER, -1, "a", hint=1), free, nodes) == worker_id(1)
    assert restart_place(member(Role.WORKER, -1, "b"), free, nodes) == worker_id(1)
    assert restart_place(member(Role.WORKER, -1, "c"), free, nodes) == worker_id(0)


def servers(n):
    return {server_id(r): member(Role.SERVER, r, f"h{r}") for r in range(n)}


def test_a_death_is_recoverable_within_the_restart_limit():
    nodes = {**servers(3), worker_id(0): member(Role.WORKER, 0)}
    assert unrecoverable(worker_id(0), nodes, {}, 0, 1, 3, [0, 1, 2]) is None
    assert unrecoverable(server_id(0), nodes, {}, 0, 1, 3, [0, 1, 2]) is None
    assert unrecoverable(worker_id(0), nodes, {}, 1, 1, 3, [0, 1, 2]) == \
        "the job has used all of its 1 restart(s) (PS_MAX_RESTARTS / --max-restarts)"
    awaited = {server_id(1): Recovery(0.0, "died")}
    assert "used all of its 1 restart(s)" in unrecoverable(worker_id(0), nodes, awaited, 0, 1, 3, [0, 1, 2])


def test_a_joint_process_dying_uses_one_restart_for_its_server_and_its_worker():
    """DMLC_ROLE=joint: server 1 and worker 1 share a process (hostname, pid); the limit counts
    processes, as the launcher's --max-restarts does."""
    nodes = servers(2)
    nodes[server_id(1)].pid = 4242
    nodes[worker_id(1)] = member(Role.WORKER, 1, "h1")
    nodes[worker_id(1)].pid = 4242
    nodes[worker_id(0)] = member(Role.WORKER, 0, "h0")
    nodes[worker_id(0)].pid = 77
    awaited = {server_id(1): Recovery(0.0, "died")}
    assert unrecoverable(worker_id(1), nodes, awaited, 0, 1, 2, [0, 1]) is None       # the same process
    assert "used all of its 1 restart(s)" in unrecoverable(worker_id(0), nodes, awaited, 0, 1, 2, [0, 1])


def test_one_server_has_no_replica_to_recover_from():
    assert "with one server there is no replica" in unrecoverable(server_id(0), servers(1), {}, 0, 3, 1, [0])


def test_a_server_next_to_one_still_recovering_cannot_be_recovered():
    nodes = servers(4)
    recovering = {server_id(1): Recovery(0.0, "died", replaced=True)}
    reason = unrecoverable(server_id(2), nodes, recovering, 1, 5, 4, [0, 1, 2, 3])
    assert reason.startswith("it failed while server 1 (S[10] at h1:9001), its neighbour in the replica ring")
    assert unrecoverable(server_id(3), nodes, recovering, 1, 5, 4, [0, 1, 2, 3]) is None


def test_a_node_state_is_dead_until_its_restart_registers_then_restarting():
    rec = Recovery(0.0, "worker 1 was killed")
    assert node_state(11, {}, {11: rec}, set(), False) == ("dead", "worker 1 was killed")
    rec.replaced = True
    assert node_state(11, {}, {11: rec}, set(), False) == ("restarting", "worker 1 was killed")
    assert node_state(11, {11: "its death ended the job"}, {}, set(), True) == ("dead", "its death ended the job")
    assert node_state(11, {}, {}, {11}, True) == ("closed", None)
    assert node_state(9, {}, {}, {11}, True) == ("ended", None)
    assert node_state(9, {}, {}, set(), False) == ("alive", None)


def test_a_restart_breaks_the_terms_only_by_another_type_or_another_chunk_it_says():
    """A worker's restart is held to the job's terms (the scheduler refuses it, naming the
    values); a server says neither, and a worker that said no chunk (an older ps) is taken."""
    terms = Terms(True, 256 << 10)
    worker = Member(Role.WORKER, "h", 1, "tcp://h:1", chunk=256 << 10)
    assert breaks_terms(terms, worker) is None
    assert breaks_terms(terms, Member(Role.WORKER, "h", 1, "tcp://h:1")) is None
    assert breaks_terms(terms, Member(Role.SERVER, "h", 1, "tcp://h:1", sync=False, chunk=1 << 20)) is None
    assert "PS_CHUNK_BYTES=1048576, and the job's workers 262144" in \
        breaks_terms(terms, Member(Role.WORKER, "h", 1, "tcp://h:1", chunk=1 << 20))
    assert "asked for dist_async, and the job is dist_sync" in \
        breaks_terms(terms, Member(Role.WORKER, "h", 1, "tcp://h:1", sync=False, chunk=256 << 10))
    assert agreed_terms([worker, Member(Role.SERVER, "h", 2, "tcp://h:2")]) == terms
    assert agreed_terms([]) == Terms(True, 0)
