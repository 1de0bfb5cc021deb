"""Synthetic-data training benchmark, written like Horovod's PyTorch synthetic benchmark.

Every rank trains a ResNet on one fixed random batch with hvd.DistributedOptimizer and rank 0
reports images/second. Apart from the import line this is plain Horovod code.

    horovodliterun -np 2 python tests/compat/pytorch_synthetic_benchmark.py \
        --image-size 32 --width 8 --batch-size 8 --fp16-allreduce
"""

import argparse
import timeit

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim

import horovodlite.torch as hvd

# The model comes from torchvision, as in Horovod's example. FALLBACK (not part of Horovod's
# example): torchvision is not installable next to the local CPU-only torch (the matching wheel
# is a CUDA build; importing it fails with "operator torchvision::nms does not exist"), so when
# it cannot be imported we use _models.py, a small ResNet with torchvision's layout whose
# `width` argument (--width) shrinks it for CPUs.
try:
    from torchvision import models

    FALLBACK_MODELS = False
except Exception:  # ImportError, or RuntimeError from a torchvision that does not match torch
    import _models as models

    FALLBACK_MODELS = True

# Benchmark settings
parser = argparse.ArgumentParser(description='PyTorch Synthetic Benchmark',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='use fp16 compression during allreduce')

parser.add_argument('--model', type=str, default='resnet18',
                    help='model to benchmark')
parser.add_argument('--batch-size', type=int, default=32,
                    help='input batch size')
parser.add_argument('--image-size', type=int, default=224,
                    help='height and width of the synthetic images')
parser.add_argument('--num-classes', type=int, default=1000,
                    help='number of classes of the synthetic labels')
parser.add_argument('--width', type=int, default=64,
                    help='base width of the fallback ResNet (ignored when torchvision is used)')

parser.add_argument('--num-warmup-batches', type=int, default=10,
                    help='number of warm-up batches that don\'t count towards benchmark')
parser.add_argument('--num-batches-per-iter', type=int, default=10,
                    help='number of batches per benchmark iteration')
parser.add_argument('--num-iters', type=int, default=10,
                    help='number of benchmark iterations')

parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')

parser.add_argument('--use-adasum', action='store_true', default=False,
                    help='use adasum algorithm to do reduction')

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    # Horovod: pin GPU to local rank.
    torch.cuda.set_device(hvd.local_rank())
    cudnn.benchmark = True
else:
    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

# Set up standard model.
model_kwargs = {'width': args.width} if FALLBACK_MODELS else {}
model = getattr(models, args.model)(num_classes=args.num_classes, **model_kwargs)

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1

if args.cuda:
    # Move model to GPU.
    model.cuda()
    # If using GPU Adasum allreduce, scale learning rate by local_size.
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Set up fixed fake data
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.LongTensor(args.batch_size).random_() % args.num_classes
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '', flush=True)


fallback_note = ' (fallback: torchvision not available)' if FALLBACK_MODELS else ''
log(f'Model: {args.model}{fallback_note}')
log(f'Batch size: {args.batch_size}')
device = 'GPU' if args.cuda else 'CPU'
log(f'Number of {device}s: {hvd.size()}')

# Warm-up
log('Running warmup...')
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

# Benchmark
log('Running benchmark...')
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f'Iter #{x}: {img_sec:.1f} img/sec per {device}')
    img_secs.append(img_sec)

# Results
img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f'Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}')
log(f'Total img/sec on {hvd.size()} {device}(s): '
    f'{hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}')
