"""DistributedOptimizer(model=...): the next forward pass waits per module instead of step()
for every gradient. Real workers and servers through the launcher; the weights must equal
the waiting path's bit for bit, and what it cannot do is refused by name."""
import json
import re

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process

torch = pytest.importorskip("torch")

SCRIPT = str(ROOT / "tests" / "torch" / "cross_worker.py")


def start(procs, extra, *args):
    env = cluster_env(0, PS_MXNET_AUTOLOAD="0", PS_STALL_WARNING="30", **extra)
    return procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                        PYTHON, SCRIPT, *args], env)


def finish(procs, launcher):
    code, out, err = procs.finish(launcher, timeout=170)
    assert code == 0, out + err
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in found) == [0, 1], out + err
    return found


def check_trained_alike(found):
    assert found["moved"], found                   # the weights trained at all
    assert found["same"] == {name: True for name in ("sgd", "adam", "adamw", "rmsprop", "adagrad")}, found


def check_refusals(found):
    said = found["refused"]
    assert "LBFGS is not one of them: pass model=None" in said["lbfgs"], said
    assert "are not parameters of that model" in said["foreign"], said
    assert "torch.compile'd model" in said["compiled"], said
    assert "'s.weight' got a new gradient before its update" in said["stale"] \
        or "'s.bias' got a new gradient before its update" in said["stale"], said


@pytest.mark.timeout(200)
def test_fused_gradients_train_to_the_numbers_of_a_key_per_parameter(procs, tmp_path):
    """PS_TORCH_FUSION: small gradients share a key. At 256 bytes this net's six gradients go
    as two buckets and one alone (first.weight, 640 bytes); at 0 each has its own key. Every
    optimizer's weights, waiting and cross-barrier, and with a module the forward skips (its
    gradients sent as zeros at step()), are the same bit for bit; in each job the cross-barrier
    path equals the waiting one, and what it cannot do is refused by name.

    The optimizers: SGD (Nesterov momentum, weight decay), Adam (L2), AdamW, RMSprop (momentum),
    Adagrad, with a StepLR schedule, a module the forward pass skips on odd steps, and an
    evaluation pass between steps. The job of a key per parameter then trains them all again
    with two backward passes per step (backward_passes_per_step=2) and under bf16 autocast:
    there too the cross-barrier path must equal the waiting one, bit for bit."""
    jobs = {limit: start(procs, {"PS_TORCH_FUSION": limit}, "--timeline", str(tmp_path / f"{limit}.json"),
                         *(["--variants"] if limit == "0" else []))
            for limit in ("0", "256")}
    found = {limit: finish(procs, job) for limit, job in jobs.items()}
    for alone, fused in zip(found["0"], found["256"]):
        for one in (alone, fused):
            check_trained_alike(one)
            check_refusals(one)
        assert alone["weights"] == fused["weights"]
        assert set(alone["variants"]) == {"p2.", "bf16."} and not fused["variants"], alone["variants"]
        for variant in alone["variants"].values():
            check_trained_alike(variant)
        # placed by size (ps.keys.balance), not by hash: every worker knows every key. The second
        # optimizer's start where the first's left off: first.weight (160 of the net's 260
        # elements) went to server 0, so the second's goes to 1 and the two fill both alike
        first, second = alone["placed"]["sgd.wait."], alone["placed"]["sgd.cross."]
        for where in (first, second):
            assert where["servers"] == where["want"] and set(where["servers"].values()) == {0, 1}, where
        assert (first["servers"]["first.weight"], second["servers"]["first.weight"]) == (0, 1), alone["placed"]
        assert len(fused["placed"]["sgd.wait."]["servers"]) == 1, fused["placed"]    # first.weight alone, the rest fused
    rows = {limit: set(re.findall(r'"name": "(allreduce\.grad\.[^"]*)"', (tmp_path / f"{limit}.json").read_text()))
            for limit in jobs}
    assert "allreduce.grad.fused.sgd.wait.side.bias.3" in rows["256"], rows["256"]        # side.*, head.1.bias
    assert "allreduce.grad.fused.sgd.cross.head.1.weight.2" in rows["256"], rows["256"]   # head.1.weight, first.bias
    assert "allreduce.grad.sgd.wait.first.weight" in rows["256"], rows["256"]             # alone
    assert not any(".fused." in r for r in rows["0"]) and "allreduce.grad.sgd.wait.side.bias" in rows["0"], rows["0"]
