"""DistributedOptimizer in a process running alone (no cluster: size 1, no sockets), as a
script runs outside a launcher: what it keeps per step must not grow with the steps."""
import pytest

torch = pytest.importorskip("torch")

import ps.torch as hvd  # noqa: E402


@pytest.mark.parametrize("cross", [False, True])
def test_the_send_timeline_keeps_one_step_not_every_step(cross, monkeypatch):
    for name in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    hvd.init()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), model=model if cross else None)
        names = [n for n, _ in model.named_parameters()]
        for step in range(50):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            # during backward, last layer first; a forward pass reads the weights the step made
            assert [n for n, _ in opt.timeline] == names[::-1], step
            opt.step()
            assert len(opt.timeline) == len(names), step
        opt.finish_updates() if cross else None
    finally:
        hvd.shutdown()
