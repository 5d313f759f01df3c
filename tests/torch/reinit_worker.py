"""``hvd.init()`` after ``hvd.shutdown()`` joins again, as Horovod allows: three sessions in one
process, each with collectives whose numbers depend on the session (a sum left over from an
earlier one would show), then a RESULT line of JSON that tests/torch/test_reinit.py checks."""
import json
import os

import torch

import ps.torch as hvd

SESSIONS = 3


def session(i, out):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out["who"].append([r, n, hvd.is_initialized()])
    out["sum"].append(hvd.allreduce(torch.tensor([float(r + 1) * (i + 1)]), name="x", op=hvd.Sum).item())
    out["bcast"].append(hvd.broadcast(torch.tensor([10.0 * r + i]), root_rank=i % n, name="b").item())
    out["gather"].append(hvd.allgather(torch.full((r + 1, 1), float(i))).view(-1).tolist())
    model = torch.nn.Linear(2, 1, bias=False)          # the same parameter names every session
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    model(torch.full((1, 2), float(r + 1) * (i + 1))).sum().backward()
    opt.step()
    out["grad"].append(model.weight.grad.view(-1).tolist())     # the average over the workers
    last = hvd.add_process_set([n - 1])                # ids are not reused: 1, 2, 3
    if last.included():
        out["set"].append([last.process_set_id, hvd.allreduce(torch.tensor([i + 1.0]), name="s",
                                                               process_set=last).item()])
    hvd.shutdown()
    out["after"].append(hvd.is_initialized())
    try:
        hvd.rank()
    except ValueError as exc:
        out["rank_after"].append(str(exc))


def main():
    out = {k: [] for k in ("who", "sum", "bcast", "gather", "grad", "set", "after", "rank_after")}
    for i in range(SESSIONS):
        session(i, out)
    try:                        # the servers keep the mode the job started with
        hvd.init(kvstore="dist_async")
    except ValueError as exc:
        out["mode"] = str(exc)
    hvd.init()
    out["rank"] = hvd.rank()
    out["last"] = hvd.allreduce(torch.tensor([1.0]), name="x", op=hvd.Sum).item()
    hvd.shutdown()
    os.write(1, f"RESULT {json.dumps(out)}\n".encode())     # one write: mpirun interleaves prints


if __name__ == "__main__":
    main()
