"""A Horovod elastic script (``@hvd.elastic.run``, ``TorchState``, ``ElasticSampler``) on ps,
run by each of 2 workers: rank 1 starts from other weights and another epoch, so only the
sync at the start of ``run`` makes the two train alike. Prints one RESULT line."""
import json

import torch

import ps.torch as hvd


def main():
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)                        # different first weights on each worker
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    data = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(10, 4) / 40, torch.arange(10.0).reshape(10, 1) / 10)
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=5 * r, batch=0)

    @hvd.elastic.run
    def train(state):
        seen = []
        for state.epoch in range(state.epoch, 2):
            for i, idx in enumerate(state.sampler):
                x, y = data[idx]
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                state.sampler.record_batch(i, 1)
                state.batch = i
                state.commit()
                seen.append(idx)
            state.sampler.set_epoch(state.epoch + 1)
        return seen

    seen = train(state)
    committed = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
        state.epoch = 99
    state.restore()
    print("RESULT " + json.dumps({"rank": r, "seen": seen, "weight": committed.tolist(),
                                  "restored": torch.equal(model.weight, committed), "epoch": state.epoch,
                                  "sampler": state.sampler.state_dict()}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
