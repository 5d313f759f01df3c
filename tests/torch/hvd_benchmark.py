"""Horovod's examples/pytorch/pytorch_synthetic_benchmark.py in shape, written for ps's tests:
``import horovod.torch as hvd`` unchanged, argparse options of the same names, a small CNN in
place of torchvision's models (not installed here), fixed fake data (each rank its own).
Rank 0 logs the example's lines; every rank ends with a RESULT line (its weights' checksum,
where ``horovod`` came from) for tests/torch/test_horovod_scripts.py."""
import argparse
import json
import os
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark (small)")
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=3)
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234 + hvd.rank())            # different initial weights: the broadcast must fix them

model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                            torch.nn.Flatten(), torch.nn.Linear(128, 10))
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                     op=hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, 32, 32)
target = torch.LongTensor(args.batch_size).random_() % 10


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log("Number of CPUs: %d" % hvd.size())
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / time)
    log("Iter #%d: %.1f img/sec per CPU" % (x, img_secs[-1]))
log("Total img/sec on %d CPU(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * np.mean(img_secs),
                                                 hvd.size() * 1.96 * np.std(img_secs)))
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
os.write(1, ("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "checksum": checksum,
                                      "horovod": hvd.__file__}) + "\n").encode())   # one write (mpirun)
