"""ResNet training in the style of Horovod's PyTorch ImageNet ResNet-50 example, made tiny.

It keeps that example's recipe: learning-rate warm-up over --warmup-epochs scaled by hvd.size(),
--batches-per-allreduce sub-batches accumulated locally (backward_passes_per_step), a Metric class
averaged across ranks with hvd.allreduce, checkpoints written by rank 0 and resumption from the
last one. The data are scikit-learn's bundled 8x8 digits upscaled to --image-size RGB images
instead of ImageNet, and the last rank gets --short-rank-batches fewer batches per epoch than the
others (uneven data), which hvd.join() absorbs at the end of each epoch. Apart from the import
line this is plain Horovod code.

    horovodliterun -np 2 python tests/compat/pytorch_imagenet_style.py --epochs 3 \
        --checkpoint-format /tmp/ckpt/checkpoint-{epoch}.pth.tar
"""

import argparse
import math
import os
import tempfile

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from tqdm import tqdm

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

# Training settings
parser = argparse.ArgumentParser(description='PyTorch ImageNet-style Example (digits)',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--checkpoint-format',
                    default=os.path.join(tempfile.gettempdir(), 'horovodlite-compat-imagenet',
                                         'checkpoint-{epoch}.pth.tar'),
                    help='checkpoint file format')
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='use fp16 compression during allreduce')
parser.add_argument('--batches-per-allreduce', type=int, default=1,
                    help='number of batches processed locally before '
                         'executing allreduce across workers; it multiplies '
                         'total batch size.')
parser.add_argument('--use-adasum', action='store_true', default=False,
                    help='use adasum algorithm to do reduction')
parser.add_argument('--gradient-predivide-factor', type=float, default=1.0,
                    help='apply gradient predivide factor in optimizer (default: 1.0)')

# Default settings from https://arxiv.org/abs/1706.02677, scaled down for a tiny dataset.
parser.add_argument('--model', type=str, default='resnet18',
                    help='model to train')
parser.add_argument('--width', type=int, default=8,
                    help='base width of the fallback ResNet (ignored when torchvision is used)')
parser.add_argument('--image-size', type=int, default=64,
                    help='the 8x8 digits are upscaled to this size')
parser.add_argument('--batch-size', type=int, default=32,
                    help='input batch size for training')
parser.add_argument('--val-batch-size', type=int, default=64,
                    help='input batch size for validation')
parser.add_argument('--epochs', type=int, default=6,
                    help='number of epochs to train')
parser.add_argument('--base-lr', type=float, default=0.0125,
                    help='learning rate for a single GPU')
parser.add_argument('--warmup-epochs', type=float, default=2,
                    help='number of warmup epochs')
parser.add_argument('--momentum', type=float, default=0.9,
                    help='SGD momentum')
parser.add_argument('--wd', type=float, default=0.00005,
                    help='weight decay')
parser.add_argument('--short-rank-batches', type=int, default=1,
                    help='the last rank trains on this many fewer batches per epoch than the '
                         'others (uneven data; hvd.join() absorbs the difference)')

parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')
parser.add_argument('--seed', type=int, default=42,
                    help='random seed')


def digits_datasets(image_size):
    """Train/validation split of sklearn's digits as 3-channel images, the same on every rank."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(image_size, image_size), mode='bilinear',
                           align_corners=False)
    images = ((images - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.RandomState(0).permutation(len(labels))
    split = len(labels) * 4 // 5
    return (torch.utils.data.TensorDataset(images[order[:split]], labels[order[:split]]),
            torch.utils.data.TensorDataset(images[order[split:]], labels[order[split:]]))


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    train_loss = Metric('train_loss')
    train_accuracy = Metric('train_accuracy')

    # Uneven data: the last rank has fewer batches than the others this epoch.
    num_batches = len(train_loader)
    if hvd.size() > 1 and hvd.rank() == hvd.size() - 1:
        num_batches = max(0, num_batches - args.short_rank_batches)

    with tqdm(total=num_batches,
              desc=f'Train Epoch     #{epoch + 1}',
              disable=not verbose) as t:
        for batch_idx, (data, target) in enumerate(train_loader):
            if batch_idx == num_batches:
                break
            adjust_learning_rate(epoch, batch_idx)

            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            # Split data into sub-batches of size batch_size
            for i in range(0, len(data), args.batch_size):
                data_batch = data[i:i + args.batch_size]
                target_batch = target[i:i + args.batch_size]
                output = model(data_batch)
                train_accuracy.update(accuracy(output, target_batch))
                loss = F.cross_entropy(output, target_batch)
                train_loss.update(loss)
                # Average gradients among sub-batches
                loss.div_(math.ceil(float(len(data)) / args.batch_size))
                loss.backward()
            # Gradient is applied across all ranks
            optimizer.step()
            t.set_postfix({'loss': train_loss.avg.item(),
                           'accuracy': 100. * train_accuracy.avg.item()})
            t.update(1)

    # Horovod: this rank is out of data; keep serving the other ranks' allreduces (with zeros)
    # until every rank has finished the epoch.
    last_joined = hvd.join()
    if verbose:
        print(f'Train Epoch #{epoch + 1}: loss {train_loss.avg.item():.4f}, '
              f'accuracy {100. * train_accuracy.avg.item():.2f}%, '
              f'last rank to join: {last_joined}', flush=True)


def validate(epoch):
    model.eval()
    val_loss = Metric('val_loss')
    val_accuracy = Metric('val_accuracy')

    with tqdm(total=len(val_loader),
              desc=f'Validate Epoch  #{epoch + 1}',
              disable=not verbose) as t:
        with torch.no_grad():
            for data, target in val_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)

                val_loss.update(F.cross_entropy(output, target))
                val_accuracy.update(accuracy(output, target))
                t.set_postfix({'loss': val_loss.avg.item(),
                               'accuracy': 100. * val_accuracy.avg.item()})
                t.update(1)

    if verbose:
        print(f'Validate Epoch #{epoch + 1}: loss {val_loss.avg.item():.4f}, '
              f'accuracy {100. * val_accuracy.avg.item():.2f}%', flush=True)


# Horovod: using `lr = base_lr * hvd.size()` from the very beginning leads to worse final
# accuracy. Scale the learning rate `lr = base_lr` ---> `lr = base_lr * hvd.size()` during
# the first warmup epochs. See https://arxiv.org/abs/1706.02677 for details.
# After the warmup reduce learning rate by 10 on the 30th, 60th and 80th epochs.
def adjust_learning_rate(epoch, batch_idx):
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1. / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    elif epoch < 30:
        lr_adj = 1.
    elif epoch < 60:
        lr_adj = 1e-1
    elif epoch < 80:
        lr_adj = 1e-2
    else:
        lr_adj = 1e-3
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj


def accuracy(output, target):
    # get the index of the max log-probability
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).cpu().float().mean()


def save_checkpoint(epoch):
    if hvd.rank() == 0:
        filepath = args.checkpoint_format.format(epoch=epoch + 1)
        state = {
            'model': model.state_dict(),
            'optimizer': optimizer.state_dict(),
        }
        torch.save(state, filepath)


# Horovod: average metrics from distributed training.
class Metric:
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


if __name__ == '__main__':
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    allreduce_batch_size = args.batch_size * args.batches_per_allreduce

    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    cudnn.benchmark = True

    # If set > 0, will resume training from a given checkpoint.
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break

    # Horovod: broadcast resume_from_epoch from rank 0 (which will have
    # checkpoints) to other ranks.
    resume_from_epoch = hvd.broadcast_object(resume_from_epoch, root_rank=0,
                                             name='resume_from_epoch')
    if resume_from_epoch > 0:
        print(f'Rank {hvd.rank()}: resuming from epoch {resume_from_epoch}',
              flush=True)

    # Horovod: print logs on the first worker.
    verbose = 1 if hvd.rank() == 0 else 0
    if verbose:
        os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint_format)), exist_ok=True)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    kwargs = {'pin_memory': True} if args.cuda else {}
    train_dataset, val_dataset = digits_datasets(args.image_size)
    # Horovod: use DistributedSampler to partition data among workers. Manually specify
    # `num_replicas=hvd.size()` and `rank=hvd.rank()`.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=allreduce_batch_size,
        sampler=train_sampler, **kwargs)

    val_sampler = torch.utils.data.distributed.DistributedSampler(
        val_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.val_batch_size,
                                             sampler=val_sampler, **kwargs)

    # Set up standard ResNet model.
    model_kwargs = {'width': args.width} if FALLBACK_MODELS else {}
    model = getattr(models, args.model)(num_classes=10, **model_kwargs)

    # By default, Adasum doesn't need scaling up learning rate.
    # For sum/average with gradient Accumulation: scale learning rate by batches_per_allreduce
    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1

    if args.cuda:
        # Move model to GPU.
        model.cuda()
        # If using GPU Adasum allreduce, scale learning rate by local_size.
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = args.batches_per_allreduce * hvd.local_size()

    # Horovod: scale learning rate by the number of GPUs.
    optimizer = optim.SGD(model.parameters(),
                          lr=(args.base_lr * lr_scaler),
                          momentum=args.momentum, weight_decay=args.wd)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor)

    # Restore from a previous checkpoint, if initial_epoch is specified.
    # Horovod: restore on the first worker which will broadcast weights to other workers.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        filepath = args.checkpoint_format.format(epoch=resume_from_epoch)
        checkpoint = torch.load(filepath)
        model.load_state_dict(checkpoint['model'])
        optimizer.load_state_dict(checkpoint['optimizer'])

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(resume_from_epoch, args.epochs):
        train(epoch)
        validate(epoch)
        save_checkpoint(epoch)
