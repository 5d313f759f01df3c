"""The wait-for rule of PS_DEADLOCK_CHECK (ps/waits.py): a verdict only for waits that can
never end, and always when no worker can move; checked against a simulation of workers
that push and wait on sync rounds."""
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.waits import BARRIER, Awaited, Report, explain, lacking, stuck


def report(rank, waits, pushes, version=0):
    return Report(rank, 1, version, tuple(Awaited(k, s, f"key {k}") for k, s in waits), dict(pushes))


def test_two_ranks_each_waiting_for_a_push_the_other_never_makes_are_stuck():
    # rank 0 reuses key 1 a second time; rank 1 moved on to a new key 2
    reports = {0: report(0, [(1, 2)], {1: 2}), 1: report(1, [(2, 1)], {1: 1, 2: 1})}
    assert stuck(reports) == {0, 1}
    text = explain(reports)
    assert "rank 0 waits for key 1, which rank 1 did not start" in text
    assert "rank 1 waits for key 2, which rank 0 did not start" in text


def test_a_wait_every_worker_has_pushed_is_not_stuck_nor_are_the_waits_only_it_holds_up():
    # rank 1 pushed key 1's second round, so rank 0's wait ends (slow server, not a disagreement);
    # rank 1 waits for key 2, which rank 0 pushes once its own wait is over
    reports = {0: report(0, [(1, 2)], {1: 2}), 1: report(1, [(2, 1)], {1: 2, 2: 1})}
    assert stuck(reports) == set()


def test_members_alone_count_for_a_process_set_key_and_a_barrier_is_a_key_like_any():
    member_wait = Report(0, 1, 0, (Awaited(7, 3, "set key", (0, 1)),), {7: 3})
    reports = {0: member_wait, 1: report(1, [(BARRIER, 1)], {7: 3, BARRIER: 1}), 2: report(2, [(5, 1)], {5: 1})}
    # rank 0's set round has every member's push (rank 2 is no member): it ends; rank 1 at the
    # barrier waits for rank 2, which waits for key 5 that ranks 0 and 1 never pushed
    assert stuck(reports) == {1, 2}
    assert lacking(member_wait.awaited[0], reports, reports) == []


def test_reports_travel_as_plain_lists():
    rep = Report(2, 4, 17, (Awaited(3, 2, "allreduce of 'w'", (0, 2)), Awaited(BARRIER, 1, "a barrier")),
                 {3: 2, BARRIER: 0})
    assert Report.from_body(rep.to_body()) == rep


# -- the rule against a simulation ---------------------------------------------------------
def run(programs, pushed, position):
    """Move every worker as far as it can: a worker at a step has pushed its key (numbered
    ``seq``) and waits until every worker has pushed that key as often; then it takes its
    next step. Returns the positions where nobody can move."""
    position = list(position)
    moved = True
    while moved:
        moved = False
        for r, prog in enumerate(programs):
            if position[r] >= len(prog):
                continue
            key, seq = prog[position[r]], seqs(prog)[position[r]]
            if all(p.get(key, 0) >= seq for p in pushed):
                position[r] += 1
                moved = True
                if position[r] < len(prog):
                    nxt = prog[position[r]]
                    pushed[r][nxt] = pushed[r].get(nxt, 0) + 1
    return position


def seqs(prog):
    seen, out = {}, []
    for key in prog:
        seen[key] = seen.get(key, 0) + 1
        out.append(seen[key])
    return out


def reports_at(programs, pushed, position):
    return {r: report(r, [(prog[position[r]], seqs(prog)[position[r]])], pushed[r])
            for r, prog in enumerate(programs) if position[r] < len(prog)}


programs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=2, max_size=4)


@settings(max_examples=300, deadline=None)
@given(programs)
def test_the_rule_never_condemns_a_wait_that_would_end_and_always_finds_a_full_deadlock(progs):
    # every worker pushes its first key, then some workers are caught before they see their
    # round close: a snapshot of blocked-looking workers, some of which can still move
    pushed = [{prog[0]: 1} for prog in progs]
    position = [0] * len(progs)
    snapshot = reports_at(progs, pushed, position)
    verdict = stuck(snapshot)
    final = run(progs, [dict(p) for p in pushed], position)
    forever = {r for r in range(len(progs)) if final[r] < len(progs[r])}
    assert verdict <= forever                       # sound: never a wait that ends
    done = run(progs, pushed, position)            # the same end state, reported as it is
    blocked = reports_at(progs, pushed, done)
    if blocked and len(blocked) == len(progs):     # nobody finished and nobody can move
        assert stuck(blocked) == set(blocked)
        assert explain(blocked).count(" waits for ") >= 1
