"""The Quorum on its own: who a key's sync round needs before it closes (every worker, a
key's members, less joined workers on joinable rounds), which rounds can never close
(a needed worker closed its store, or joined), and that it moves by the events the Store
journals, so a restored copy judges as its dead self did."""
import pytest

from ps.server.events import Event
from ps.server.quorum import Quorum
from ps.server.rounds import DEAD, Round

W0, W1, W2 = 9, 11, 13          # workers 0, 1, 2


def round_of(complete=(), begun=(), joinable=False):
    """A round ``complete`` pushed whole and ``begun`` started to push."""
    rnd = Round()
    for w in (*complete, *begun):
        rnd.members[w] = 100 + w
    rnd.complete = set(complete)
    rnd.joinable = joinable
    return rnd


def members(q, keys, workers):
    q.apply(Event("members", 0, 0, [keys, sorted(workers)]))


def test_every_worker_is_needed_and_plain_counts_decide():
    q = Quorum(3)
    assert q.plain and not q.some_stopped and q.needed(5) == 3
    assert not q.round_full(5, round_of([W0, W1]))
    assert q.round_full(5, round_of([W0, W1, W2]))
    assert q.chunk_full(5, round_of(), [(W0, None), (W1, None), (W2, None)])
    assert q.refusal(5, W1) is None and q.doom(5, round_of([W0])) is None


def test_a_members_key_needs_only_its_members_and_refuses_the_others():
    q = Quorum(3)
    members(q, [5], [W0, W2])
    assert not q.plain and q.needed(5) == 2 and q.needed(6) == 3
    assert q.round_full(5, round_of([W0, W2])) and not q.round_full(6, round_of([W0, W2]))
    refused = q.refusal(5, W1)
    assert refused.kind == "ValueError" and "[0, 2]" in refused.text and "worker 1 (W[11])" in refused.text
    assert q.refusal(6, W1) is None
    assert q.missing(5, round_of([W0]), [W0, W1, W2]) == (W2,)      # worker 1 is not waited for


def test_members_are_checked_against_the_job_and_only_new_keys_count():
    q = Quorum(2)
    members(q, [5], [W0])
    assert q.group([5, 6], [W0]) == ([6], frozenset({W0}))
    for bad in ([], [W0, W2]):
        with pytest.raises(RuntimeError, match="non-empty set of this job's 2 workers"):
            q.group([7], bad)


def test_a_joined_worker_is_excused_from_joinable_rounds_and_dooms_the_others():
    q = Quorum(3)
    q.apply(Event("join", 0, 0, W2))
    assert not q.plain and q.some_stopped
    assert q.round_full(5, round_of([W0, W1], joinable=True))
    assert q.excused(5, round_of([W0, W1], joinable=True)) == [W2]
    assert q.chunk_full(5, round_of(joinable=True), [(W0, None), (W1, None)])
    assert not q.round_full(5, round_of([W0, W1]))                  # not joinable: it still needs worker 2
    doom = q.doom(5, round_of([W0, W1]))
    assert doom.kind == "CollectiveError" and "worker 2 (W[13]) joined (hvd.join)" in doom.text
    assert q.doom(5, round_of([W0], joinable=True)) is None
    assert q.missing(5, round_of([W0], joinable=True), [W0, W1, W2]) == (W1,)


def test_a_joined_worker_outside_a_keys_members_is_not_excused_from_it():
    q = Quorum(3)
    members(q, [5], [W0, W1])
    q.apply(Event("join", 0, 0, W2))
    assert q.excused(5, round_of([W0, W1], joinable=True)) == []
    assert q.doom(5, round_of([W0, W1])) is None


def test_leaving_ends_the_join_and_a_resent_leave_gets_the_same_answer():
    q = Quorum(2)
    q.apply(Event("join", 0, 0, W1))
    q.apply(Event("join", 0, 0, W0))
    assert q.last_to_join(W0) == W0 and q.left_before(W1) is None
    q.apply(Event("leave", 0, 0, [W1, W0, [[5, 2]]]))
    assert q.left_before(W1) == (W0, [(5, 2)])
    q.apply(Event("leave", 0, 0, [W0, W0, []]))
    assert q.plain and not q.some_stopped and q.last_to_join(W1) == W1


def test_a_closed_worker_is_refused_and_dooms_the_rounds_it_did_not_push_to():
    q = Quorum(3)
    q.close(W1)
    assert q.some_stopped and q.plain          # the counts still decide when a round is full
    refused = q.refusal(5, W1)
    assert refused.kind == "PeerLostError" and "worker 1 (W[11]) already closed its store" in refused.text
    doom = q.doom(5, round_of([W0]))
    assert doom.kind == "PeerLostError" and "can never complete: worker 1 (W[11]) closed its store" in doom.text
    assert q.doom(5, round_of([W0], begun=[W1])) is None     # it pushed some of this round before closing


def test_a_round_a_dead_worker_began_waits_for_its_restart():
    """Restarts: the dead worker's begun push stays its own (Round.members[w] = DEAD) until
    its restart finishes it: the round is not full, and not doomed by anyone closing."""
    q = Quorum(2)
    rnd = round_of([W0], begun=[W1])
    rnd.members[W1] = DEAD
    assert not q.round_full(5, rnd)
    q.close(W1)
    assert q.doom(5, rnd) is None
    rnd.complete.add(W1)                     # its restart sent the rest
    assert q.round_full(5, rnd)


def test_a_quorum_restored_from_a_snapshot_judges_as_before():
    """A restarted server's store gets its quorum from its backup: the snapshot's joins
    event and the members; it then excuses and answers leaves as its dead self would."""
    q = Quorum(3)
    members(q, [5], [W0, W1, W2])
    q.apply(Event("join", 0, 0, W2))
    q.apply(Event("join", 0, 0, W1))
    again = Quorum(3)
    again.apply(Event("joins", 0, 0, q.joins.info()))
    members(again, [5], [W0, W1, W2])
    assert list(again.joins.joined) == [W2, W1] and again.last_to_join(W0) == W1
    assert not again.plain and again.some_stopped
    assert again.excused(5, round_of([W0], joinable=True)) == q.excused(5, round_of([W0], joinable=True)) == [W2, W1]
