"""ps.torch.Embedding/EmbeddingBag: tables on the servers. Two workers in sync mode must end
with the rows one process gets from torch's own sparse nn.EmbeddingBag on the whole batch
(SGD, Adagrad, SparseAdam; ids never seen before, negative and huge ids, empty bags, an id
twice in a batch), and bad input is named. tests/torch/embedding_worker.py does the work."""
import json
import re

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process

torch = pytest.importorskip("torch")

SCRIPT = str(ROOT / "tests" / "torch" / "embedding_worker.py")


def results(procs, command, ranks, alone=False, stalls=None):
    env = cluster_env(0, PS_MXNET_AUTOLOAD="0", PS_STALL_WARNING="1")
    if alone:
        env = {k: v for k, v in env.items() if not k.startswith("DMLC_")}
    proc = procs.start(command, env)
    code, out, err = procs.finish(proc, timeout=150)
    assert code == 0, out + err
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in found) == ranks, out + err
    if stalls is not None:
        stalls.append(out + err)
    return found


def check(found, size):
    assert found["size"] == size
    for case, diff in found["diffs"].items():
        assert diff <= 1e-5, (case, found)
    assert all(moved > 0.05 for moved in found["moved"].values()), found      # the rows trained at all
    said = found["said"]
    assert "ids must be an integer tensor (torch.long), got torch.float32" in said["float ids"], said
    assert "offsets [0, 5] do not match an input of 3 ids" in said["offsets"], said
    assert "table 'sgd-sum' exists with dimension 8; this declaration asks for 9" in said["dimension"], said
    assert "prefetch() reads rows before this step's sync round closes" in said["prefetch"], said
    # torch.compile: the pulls, checks and gradient hooks stay outside the graph, and the losses
    # and rows equal the eager run's, alone and on 2 workers
    compiled = found["compile"]
    assert compiled["compiled"] == compiled["eager"] and compiled["same_rows"], compiled
    assert compiled["moved"] > 1e-3, compiled                 # it trained at all (from zeros)


@pytest.mark.timeout(180)
def test_two_workers_in_sync_equal_one_process_on_the_whole_batch(procs):
    """Also: a worker 2.5 s late to a round is named to the one that waits (PS_STALL_WARNING=1)."""
    logs = []
    for found in results(procs, [PYTHON, "-m", "ps.launch", "-n", "2", "-s", "3", "--launcher", "local",
                                 PYTHON, SCRIPT], [0, 1], stalls=logs):
        check(found, 2)
    assert re.search(r"\[worker 0\].*is waiting: server \d \(S\[\d+\]\): sync round 1 of embedding table "
                     r"'slow' has waited \ds for worker 1 \(W\[11\]", logs[0]), logs[0]
    assert "the stalled sync round 1 of embedding table 'slow' went on" in logs[0], logs[0]


@pytest.mark.timeout(180)
def test_a_process_alone_keeps_its_tables_itself(procs):
    """No cluster: init() runs alone, the tables live in the process, with the same numbers."""
    [found] = results(procs, [PYTHON, SCRIPT], [0], alone=True)
    check(found, 1)


@pytest.mark.timeout(180)
def test_the_click_model_example_learns_on_two_workers(procs):
    """docs/embeddings.md's example, as it tells a user to run it (fewer steps)."""
    proc = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                        PYTHON, str(ROOT / "examples" / "embedding_train.py"), "--steps", "150"],
                       cluster_env(0, PS_MXNET_AUTOLOAD="0"))
    code, out, err = procs.finish(proc, timeout=160)
    assert code == 0, out + err
    losses = re.findall(r"worker (\d): first 50 steps log-loss ([0-9.]+), last 50 ([0-9.]+)", out)
    assert sorted(w for w, _, _ in losses) == ["0", "1"], out + err
    for _, first, last in losses:
        assert float(last) < float(first) - 0.03, out     # it learned


@pytest.mark.timeout(180)
def test_a_table_saved_from_two_servers_loads_onto_three_with_the_same_rows_and_optimizer_state(procs, tmp_path):
    """Adam's moments and step count come back too: the step after the load equals the step
    after the save."""
    script = str(ROOT / "tests" / "torch" / "embedding_ckpt_worker.py")
    saved = results(procs, [PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            PYTHON, script, "save", str(tmp_path / "ckpt")], [0, 1])
    [loaded] = results(procs, [PYTHON, "-m", "ps.launch", "-n", "1", "-s", "3", "--launcher", "local",
                               PYTHON, script, "load", str(tmp_path / "ckpt")], [0])
    assert saved[0]["before"] == loaded["before"]
    first = next(r for r in saved if r["rank"] == 0)
    assert first["served"] == first["before"]                # the serving export of the same rows
    assert saved[0]["after"] == loaded["after"] and loaded["after"] != loaded["before"]
