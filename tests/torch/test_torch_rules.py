"""The servers' PyTorch rules (ps.optim.TorchSGD / TorchAdam, run by ps's Updater as a
server runs them) against torch.optim itself, bit for bit, step by step."""
import numpy as np
import pytest

from ps import optim

torch = pytest.importorskip("torch")


def run_both(torch_opt_cls, torch_kwargs, ps_opt, steps=6, shape=(37, 5), chunks=False):
    rng = np.random.default_rng(3)
    start = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(steps)]
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    ref = torch_opt_cls([param], **torch_kwargs)
    updater = optim.Updater(ps_opt)
    weight = start.reshape(-1).copy()
    for i, g in enumerate(grads):
        param.grad = torch.from_numpy(g.copy())
        ref.step()
        if chunks:            # as a server applies an elementwise rule: chunk by chunk
            updater.begin(7, weight)
            for off in range(0, weight.size, 50):
                updater.update_chunk(7, off, g.reshape(-1)[off:off + 50].copy(), weight)
        else:
            updater(7, g.reshape(-1).copy(), weight)
        np.testing.assert_array_equal(weight, param.detach().numpy().reshape(-1), err_msg=f"step {i + 1}")


@pytest.mark.parametrize("kw", [dict(momentum=0.0), dict(momentum=0.9, weight_decay=0.01),
                                dict(momentum=0.9, dampening=0.1), dict(momentum=0.9, nesterov=True, weight_decay=1e-3)])
@pytest.mark.parametrize("chunks", [False, True])
def test_sgd_equals_torch_optim_bit_for_bit(kw, chunks):
    ps_opt = optim.TorchSGD(learning_rate=0.05, momentum=kw.get("momentum", 0.0), dampening=kw.get("dampening", 0.0),
                            nesterov=kw.get("nesterov", False), wd=kw.get("weight_decay", 0.0))
    run_both(torch.optim.SGD, dict(lr=0.05, **kw), ps_opt, chunks=chunks)


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.01, betas=(0.8, 0.99), eps=1e-6), dict(amsgrad=True)])
@pytest.mark.parametrize("chunks", [False, True])
def test_adam_equals_torch_optim_bit_for_bit(kw, chunks):
    b1, b2 = kw.get("betas", (0.9, 0.999))
    ps_opt = optim.TorchAdam(learning_rate=0.01, beta1=b1, beta2=b2, eps=kw.get("eps", 1e-8),
                             amsgrad=kw.get("amsgrad", False), wd=kw.get("weight_decay", 0.0))
    run_both(torch.optim.Adam, dict(lr=0.01, **kw), ps_opt, chunks=chunks)


def test_the_rules_travel_as_specs():
    opt = optim.from_spec(optim.TorchAdam(learning_rate=0.02, beta1=0.8, amsgrad=True).to_spec())
    assert isinstance(opt, optim.TorchAdam) and (opt.lr, opt.beta1, opt.amsgrad) == (0.02, 0.8, True)
