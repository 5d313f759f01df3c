"""A ps.torch training loop in which rank 1 SIGKILLs, once, a server or itself (test_torch.py):

    python restart_worker.py MARKER_FILE server|worker|none [join] [table]

Prints ``DONE [rank, weights]`` at the end; the marker file says the kill happened already (a
restarted worker runs this script again). ``join``: rank 0 trains 5 steps and joins
(Horovod's uneven data), so the kill at step 10 comes while it is in join; then every rank
prints ``DONE [rank, weights, last to join, a sum after the join]``. ``table``: the model
also reads an embedding table on the servers (ps.torch.EmbeddingBag, Adagrad, sync); every
rank prints ``DONE [rank, weights, the table's rows of every id it used]``; with both, the
join's two and then the rows."""
import json
import os
import signal
import sys
import time

import torch

import ps.torch as hvd
from ps.optim import rowwise
from tests.integration.recovery_worker import find

IDS = torch.tensor([[3, -7, 2**40], [11, 3, 5], [-1, 0, 9], [2**62, 5, 12]])    # 4 bags of 3


def main():
    marker, victim = sys.argv[1], sys.argv[2]
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    table = hvd.EmbeddingBag(8, "sum", name="restart", optimizer=rowwise.Adagrad(lr=0.1)) \
        if "table" in sys.argv[3:] else None
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    uneven = "join" in sys.argv[3:]
    for step in range(5 if uneven and hvd.rank() == 0 else 30):
        x = torch.arange(32.0).reshape(4, 8) * (hvd.rank() + 1) / 32
        if table is not None:
            x = x + table(IDS + step % 3 + hvd.rank())
        opt.zero_grad()
        ((model(x) - 1.0) ** 2).mean().backward()
        opt.step()
        if step == 10 and hvd.rank() == 1 and victim != "none" and not os.path.exists(marker):
            open(marker, "w").close()
            if victim == "worker":
                os.kill(os.getpid(), signal.SIGKILL)
            find("server", 1).send_signal(signal.SIGKILL)
        time.sleep(0.05)
    done = [hvd.rank(), model.weight.detach().reshape(-1).tolist()]
    if uneven:
        done += [hvd.join(), hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()]
    if table is not None:
        table.flush()
        used = torch.unique(torch.cat([(IDS + k).reshape(-1) for k in range(4)]))
        done.append(table.table().pull(used.numpy()).reshape(-1).tolist())
    print("DONE " + json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
