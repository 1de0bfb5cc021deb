"""ElasticSampler: a distributed sampler that remembers which samples were processed, so that
training resumed after a failure (``hvd.elastic.run``) does not see a sample twice in an epoch.

Protocol. Every rank computes the same ordered list from the same inputs - the dataset length,
the set of processed indices, ``seed + epoch`` - and takes every ``size()``-th element of it
starting at its rank:

1. remaining = the indices not processed yet this epoch, in increasing order;
2. with ``shuffle``, permute them with a generator seeded by ``seed + epoch`` (identical on
   every rank, and different for every epoch);
3. pad by wrapping around to a multiple of ``size()``, so every rank gets the same number of
   samples and therefore runs the same number of steps (collectives stay in lockstep);
4. rank r takes positions r, r + size, r + 2 size, ...

``record_batch(b, size)`` marks batch ``b`` of *every* rank processed: the ranks step together,
so when this rank's step ``b`` applied, every rank's batch ``b`` was in its reduction - and every
rank can compute every rank's share (the order above is the same everywhere). A rank that is
lost later is then not lost with what it trained on: its samples of the steps that were applied
are processed, and the survivors do not see them again. ``record_indices`` adds only the
indices given (this rank's, typically). ``TorchState.sync`` merges every rank's set (union) and
calls ``load_state_dict``, which partitions the remaining indices again (``reset``).
``set_epoch`` starts a new epoch with nothing processed.
"""

from __future__ import annotations

import math

import torch

from horovodlite.common.basics import rank, size


def ordered(num_items: int, processed, shuffle: bool, seed: int, epoch: int,
            num_replicas: int) -> list[int]:
    """Steps 1-3 above: every replica's indices this epoch, interleaved (replica r takes
    positions r, r + num_replicas, ...). Pure function of its arguments."""
    remaining = [i for i in range(num_items) if i not in processed]
    if shuffle and remaining:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(len(remaining), generator=g).tolist()
        remaining = [remaining[i] for i in order]
    per_replica = math.ceil(len(remaining) / num_replicas)
    return [remaining[i % len(remaining)] for i in range(per_replica * num_replicas)]


def partition(num_items: int, processed, shuffle: bool, seed: int, epoch: int,
              num_replicas: int, replica: int) -> list[int]:
    """The indices ``replica`` of ``num_replicas`` processes this epoch (steps 1-4 above).

    Pure function of its arguments: every rank gets a consistent share without communicating.
    """
    return ordered(num_items, processed, shuffle, seed, epoch, num_replicas)[
        replica::num_replicas]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards ``dataset`` over ``hvd.size()`` ranks and remembers processed samples.

    Put it into ``hvd.elastic.TorchState`` (``TorchState(model, optimizer, sampler=s)``) so that
    commits snapshot it and resets merge and re-partition what is left. Needs ``hvd.init()``.

    Typical loop (``batch_size`` per rank)::

        for batch_idx, batch in enumerate(loader):      # loader uses sampler=s
            ...train...
            s.record_batch(batch_idx, batch_size)      # batch_idx counts from the last reset
            if batch_idx % 10 == 0:
                state.commit()
        state.epoch += 1
        s.set_epoch(state.epoch)
        state.commit()
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch``: a new order (``seed + epoch``) and nothing processed."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The indices of this rank's batch ``batch_idx`` since the last reset."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Marks batch ``batch_idx`` (counted since the last reset) of every rank as processed:
        call it once the step that trained on it is applied (see the top)."""
        n = self.num_replicas
        self.record_indices(self._order[batch_idx * batch_size * n:
                                        (batch_idx + 1) * batch_size * n])

    def record_indices(self, indices) -> None:
        """Marks dataset ``indices`` as processed by this rank."""
        self.processed_indices.update(int(i) for i in indices)

    def get_processed_indices(self) -> set[int]:
        """A copy of the indices this rank knows to be processed this epoch."""
        return set(self.processed_indices)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes the epoch and processed indices, then re-partitions (``reset``)."""
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = {int(i) for i in state_dict["processed_indices"]}
        self.reset()

    def reset(self) -> None:
        """Partitions the not-yet-processed indices over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        # every rank's share, interleaved: rank r's batch b is _order[(b * bs + j) * n + r]
        self._order = ordered(len(self.dataset), self.processed_indices, self.shuffle,
                              self.seed, self.epoch, self.num_replicas)
        self.indices = self._order[self.rank::self.num_replicas]
        self.num_samples = len(self.indices)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticSampler", "partition"]
