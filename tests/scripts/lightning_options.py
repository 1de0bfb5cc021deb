"""Lightning's Trainer options with HorovodLiteStrategy, each against DDPStrategy in the same job
(tests/test_lightning.py runs it at np 2). Every rank asserts and prints ``CHECK <name> ok``.

    horovodliterun -np 2 python tests/scripts/lightning_options.py [--lightning]

- precision "bf16-mixed" and "16-mixed", ``accumulate_grad_batches=2``, ``gradient_clip_val``:
  the weights equal DDPStrategy's (float32, to the order of the additions);
- an optimizer wrapped with ``shard=`` in ``configure_optimizers``: equal to DDPStrategy's;
- ``sync_batchnorm=True``: the BatchNorm layers become ``hvd.SyncBatchNorm`` while training (and
  their own class again after it, as DDPStrategy reverts them) and training equals
  one process on the global batch (torch's own SyncBatchNorm, which DDPStrategy uses, runs on
  GPUs only, so the reference is one process: batch statistics over the global batch are what
  synchronised batch norm computes).
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import horovodlite.torch as hvd

if "--lightning" in sys.argv:
    import lightning.pytorch as pl

    import horovodlite.lightning.pytorch as hl
else:
    import pytorch_lightning as pl

    import horovodlite.lightning as hl

sys.stdout.reconfigure(line_buffering=True)
warnings.filterwarnings("ignore")
torch.set_num_threads(1)

ROWS, STEPS, LR = 4, 6, 0.05  # rows per rank and step


def make_net() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    n = ROWS * STEPS * hvd.size()
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g))


class Model(pl.LightningModule):
    def __init__(self, shard=None):
        super().__init__()
        self.net = make_net()
        self.shard = shard

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)
        if self.shard is None:
            return opt
        return hvd.DistributedOptimizer(opt, named_parameters=self.named_parameters(),
                                        shard=self.shard)


class SeeLayer(pl.Callback):
    """Calls ``see(module)`` once, at the first training batch."""

    def __init__(self, see):
        self.see, self.seen = see, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.seen:
            self.see(pl_module)
            self.seen = True


def fit(strategy, model, rows_per_batch=ROWS, **kw) -> dict:
    if not isinstance(strategy, str):  # DDPStrategy: one process per device, as launched
        kw.update(devices=hvd.local_size(), num_nodes=hvd.cross_size())
    t = pl.Trainer(strategy=strategy, accelerator="cpu", max_epochs=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, **kw)
    t.fit(model, DataLoader(data(), batch_size=rows_per_batch, shuffle=False))
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}


def ddp():
    return pl.strategies.DDPStrategy(cluster_environment=hl.HorovodLiteEnvironment(),
                                     process_group_backend="gloo")


def close(name: str, got: dict, want: dict, rtol: float, buffers: bool = False) -> None:
    """The parameters, relative to their norm; the buffers (batch norm's running statistics)
    with ``buffers`` or on rank 0: DDPStrategy broadcasts rank 0's buffers at each forward,
    horovodlite (as Horovod) leaves each rank its own."""
    worst = 0.0
    for k, w in want.items():
        if "running" in k or "num_batches" in k:
            if not buffers and hvd.rank() != 0:
                continue
        if w.is_floating_point():
            worst = max(worst, float((got[k] - w).norm() / max(w.norm(), 1e-12)))
        else:
            assert torch.equal(got[k], w), f"rank {hvd.rank()}: {name}: {k}"
    assert worst < rtol, f"rank {hvd.rank()}: {name}: relative error {worst:.3g}"
    print(f"rank {hvd.rank()}: CHECK {name} ok (relative error {worst:.2g})")


def one_process() -> dict:
    """Plain torch on the global batch: each step's rows of every rank, batch norm over all of
    them. Lightning hands a distributed strategy torch's DistributedSampler (shuffling, seed
    0): rank r takes every n-th index of one permutation."""
    net, d, n = make_net(), data(), hvd.size()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    perm = torch.randperm(len(d), generator=torch.Generator().manual_seed(0))
    order = [perm[r::n] for r in range(n)]
    for s in range(STEPS):
        rows = torch.cat([o[s * ROWS:(s + 1) * ROWS] for o in order])
        opt.zero_grad()
        x, y = d.tensors[0][rows], d.tensors[1][rows]
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def main() -> None:
    hvd.init()
    cases = [("bf16_mixed", dict(precision="bf16-mixed"), 2e-3),
             ("fp16_mixed", dict(precision="16-mixed"), 2e-3),
             ("accumulate_grad_batches", dict(accumulate_grad_batches=2), 1e-5),
             ("gradient_clip_val", dict(gradient_clip_val=0.05), 1e-5)]
    for name, kw, rtol in cases:
        rows = ROWS // 2 if "accumulate_grad_batches" in kw else ROWS
        close(f"{name}_equals_ddp", fit("horovodlite", Model(), rows, **kw),
              fit(ddp(), Model(), rows, **kw), rtol)
    want = fit(ddp(), Model())
    for shard in ("optimizer_state", "gradients"):
        close(f"shard_{shard}_equals_ddp", fit("horovodlite", Model(shard)), want, 1e-5)
    model = Model()
    synced = []
    got = fit("horovodlite", model, sync_batchnorm=True,
              callbacks=[SeeLayer(lambda m: synced.append(type(m.net[1])))])
    assert synced == [hvd.SyncBatchNorm], synced  # while training
    # after it, the user's own class again (DDPStrategy's teardown reverts too, to a generic one)
    assert type(model.net[1]) is torch.nn.BatchNorm1d, type(model.net[1])
    close("sync_batchnorm_equals_one_process", got, one_process(), 1e-5, buffers=True)
    print(f"rank {hvd.rank()}: DONE", flush=True)


if __name__ == "__main__":
    main()
