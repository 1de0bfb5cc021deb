"""MNIST-style training with elastic state, written like Horovod's PyTorch elastic MNIST example.

Trains on scikit-learn's bundled 8x8 digits (no download). The training function is wrapped in
@hvd.elastic.run and commits a hvd.elastic.TorchState every --batches-per-commit batches, so a
failed collective rolls every rank back to the last commit and training resumes from there.
horovodliterun has no elastic driver, so this runs as a normal job; --fail-at-batch simulates a
failure once (not part of Horovod's example) to exercise the reset path. Apart from the import
line this is plain Horovod code.

    horovodliterun -np 2 python tests/compat/pytorch_mnist_elastic.py --epochs 5
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits

import horovodlite.torch as hvd

# Training settings
parser = argparse.ArgumentParser(description='PyTorch Elastic MNIST-style Example (digits)')
parser.add_argument('--batch-size', type=int, default=16, metavar='N',
                    help='input batch size for training (default: 16)')
parser.add_argument('--test-batch-size', type=int, default=100, metavar='N',
                    help='input batch size for testing (default: 100)')
parser.add_argument('--epochs', type=int, default=10, metavar='N',
                    help='number of epochs to train (default: 10)')
parser.add_argument('--lr', type=float, default=0.05, metavar='LR',
                    help='learning rate (default: 0.05)')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M',
                    help='SGD momentum (default: 0.5)')
parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')
parser.add_argument('--seed', type=int, default=42, metavar='S',
                    help='random seed (default: 42)')
parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                    help='how many batches to wait before logging training status')
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='use fp16 compression during allreduce')
parser.add_argument('--use-adasum', action='store_true', default=False,
                    help='use adasum algorithm to do reduction')
parser.add_argument('--batches-per-commit', type=int, default=10,
                    help='number of batches processed before calling `state.commit()`; '
                         'commits prevent losing progress if an error occurs, but slow '
                         'down training.')
parser.add_argument('--fail-at-batch', type=int, default=-1, metavar='N',
                    help='simulate a failure once: the last rank raises HorovodInternalError '
                         'at this batch of epoch 2, and every rank resumes from the last '
                         'commit (default: -1, never)')


def load_digits_datasets():
    """Train/test split of sklearn's digits, normalised like MNIST, identical on every rank."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.RandomState(0).permutation(len(labels))
    split = len(labels) * 4 // 5
    train_idx, test_idx = order[:split], order[split:]
    mean, std = images[train_idx].mean(), images[train_idx].std()
    images = (images - mean) / std
    return (torch.utils.data.TensorDataset(images[train_idx], labels[train_idx]),
            torch.utils.data.TensorDataset(images[test_idx], labels[test_idx]))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


failures_left = [1]


def check_simulated_failure(epoch, batch):
    """--fail-at-batch: the last rank reports a (simulated) failed collective once."""
    if (args.fail_at_batch >= 0 and failures_left[0] > 0 and epoch == 2
            and batch == args.fail_at_batch and hvd.rank() == hvd.size() - 1):
        failures_left[0] -= 1
        print(f'Rank {hvd.rank()}: simulating a failure at epoch {epoch} batch {batch}', flush=True)
        raise hvd.HorovodInternalError('simulated failure')


@hvd.elastic.run
def train(state):
    # post synchronization event (worker added, worker removed) init ...
    if hvd.rank() == 0 and state.batch > 0:
        print(f'Resuming epoch {state.epoch} at batch {state.batch}', flush=True)
    # (B020: assigning the loop variable to state.epoch is Horovod's elastic idiom.)
    for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020
        state.model.train()
        # Elastic Horovod: after a reset the sampler only yields the samples of this epoch
        # that have not been processed yet; state.batch counts the batches done before.
        batch_offset = state.batch
        for batch_idx, (data, target) in enumerate(train_loader):
            state.batch = batch_offset + batch_idx
            check_simulated_failure(state.epoch, state.batch)
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                print(f'Train Epoch: {state.epoch} [{state.batch * len(data)}/'
                      f'{len(train_sampler)}]\tLoss: {loss.item():.6f}')

            # Elastic Horovod: record which samples were processed this batch
            # so we do not reprocess them if a reset event occurs.
            state.train_sampler.record_batch(batch_idx, args.batch_size)
            state.batch += 1
            # Elastic Horovod: commit the state every few batches.
            if state.batch % args.batches_per_commit == 0:
                state.commit()

        test(state.epoch)
        # Elastic Horovod: the end-of-epoch commit records the next epoch (a new shuffle,
        # nothing processed yet), so a rollback to it does not repeat this one. The for loop
        # then assigns the same value to state.epoch.
        state.batch = 0
        state.epoch += 1
        state.train_sampler.set_epoch(state.epoch)
        state.commit()


def test(epoch):
    model.eval()
    test_loss = 0.
    test_accuracy = 0.
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            # sum up batch loss
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            # get the index of the max log-probability
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()

    # Horovod: use test_sampler to determine the number of examples in
    # this worker's partition.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)

    # Horovod: average metric values across workers.
    test_loss = metric_average(test_loss, 'avg_loss')
    test_accuracy = metric_average(test_accuracy, 'avg_accuracy')

    # Horovod: print output only on first rank.
    if hvd.rank() == 0:
        print(f'\nTest Epoch: {epoch}, Average loss: {test_loss:.4f}, '
              f'Accuracy: {100. * test_accuracy:.2f}%\n', flush=True)


def on_state_reset():
    # Horovod: scale the learning rate to the new number of workers.
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.lr * lr_scaler()
    if hvd.rank() == 0:
        print('State reset: {} workers, lr {:.4f}'.format(
            hvd.size(), optimizer.param_groups[0]['lr']), flush=True)


def lr_scaler():
    # By default, Adasum doesn't need scaling up learning rate.
    return hvd.size() if not args.use_adasum else 1


if __name__ == '__main__':
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    kwargs = {'pin_memory': True} if args.cuda else {}
    train_dataset, test_dataset = load_digits_datasets()

    # Elastic Horovod: use ElasticSampler to partition data among workers.
    train_sampler = hvd.elastic.ElasticSampler(train_dataset)
    train_sampler.set_epoch(1)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)

    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler, **kwargs)

    model = Net()

    if args.cuda:
        # Move model to GPU.
        model.cuda()

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler(),
                          momentum=args.momentum)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)

    # Elastic Horovod: the state to synchronise, commit and restore. Parameters and optimizer
    # state are broadcast from rank 0 when train() starts (no explicit broadcast needed).
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler,
                                   epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    if hvd.rank() == 0:
        print(f'Training finished after epoch {state.epoch - 1}', flush=True)
