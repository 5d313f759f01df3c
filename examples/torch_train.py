"""Train a small CNN with PyTorch on ps, through Horovod's API (`import ps.torch as hvd`).

    python -m ps.launch -n 2 -s 2 --launcher local python examples/torch_train.py
    python examples/torch_train.py                  # alone: size 1, the same code

The data are generated (no download): 16x16 images of a bright square whose quadrant is the
label, with noise. Every worker draws its own share; gradients are averaged over workers
before each step, so N workers train as one process on N times the batch.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import ps.torch as hvd


def make_batch(n, generator):
    labels = torch.randint(0, 4, (n,), generator=generator)
    x = torch.randn(n, 1, 16, 16, generator=generator)
    for i, quadrant in enumerate(labels.tolist()):
        r, c = divmod(quadrant, 2)
        x[i, 0, 8 * r + 2:8 * r + 6, 8 * c + 2:8 * c + 6] += 0.5
    return x, labels


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = torch.nn.Linear(8 * 8 * 8, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(1 + hvd.rank())
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = make_batch(args.batch_size, gen)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
            if hvd.rank() == 0:
                print(f"step {step}: loss {mean_loss:.3f} (mean over {hvd.size()} workers)", flush=True)
    x, y = make_batch(512, torch.Generator().manual_seed(99))
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    if hvd.rank() == 0:
        print(f"accuracy {accuracy:.3f} on 512 new images; {1000 * (time.perf_counter() - start) / args.steps:.1f} "
              f"ms/step with {hvd.size()} worker(s)", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
