"""One multi-rank job checking horovodlite.lightning (tests/test_lightning.py runs it). Every rank
asserts and prints ``CHECK <name> ok`` per check, so the test sees that each rank got there.

    python lightning_job.py fit CKPT [--raise] [--core] [--resume FROM]   at np 2:
        HorovodLiteStrategy fit (20 steps, accumulate_grad_batches=2) equal to one process on
        the global batch and to DDPStrategy in the same job; sync_dist metrics; a checkpoint
        written by rank 0 to CKPT; validate, test, predict, torchmetrics, manual optimization
        (not with --core). --resume: FROM, a checkpoint saved at another number of ranks,
        resumed for a second epoch equals 40 single-process steps. --raise: then a fit in
        which rank 1 raises at its 4th batch.
    python lightning_job.py save CKPT            at any np dividing 12: 20 steps equal to one
        process, the checkpoint written to CKPT (for another job's --resume).

--lightning: the unified ``lightning`` package's namespace (``lightning.pytorch`` and
``horovodlite.lightning.pytorch``) instead of ``pytorch_lightning``.

The model is float64, so "equal" is to rounding (relative 1e-6 is asserted, the error printed).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torchmetrics
from torch.utils.data import DataLoader, Dataset

import horovodlite.torch as hvd

if "--lightning" in sys.argv:
    import lightning.pytorch as pl

    import horovodlite.lightning.pytorch as hl
else:
    import pytorch_lightning as pl

    import horovodlite.lightning as hl

sys.stdout.reconfigure(line_buffering=True)
warnings.filterwarnings("ignore")  # Lightning's advice (num_workers, logging intervals)
torch.set_num_threads(1)

GLOBAL_BATCH, STEPS, FEATURES, CLASSES = 12, 20, 8, 4
SAMPLES = GLOBAL_BATCH * STEPS
LR, MOMENTUM = 0.1, 0.9


class Data(Dataset):
    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def make_net() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, CLASSES)).double()


class Model(pl.LightningModule):
    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.net = make_net()
        self.fail_at = fail_at
        # a torchmetrics metric synchronised through horovodlite, not torch.distributed
        self.val_mean = torchmetrics.MeanMetric(**hl.metric_sync_kwargs()).double()

    def training_step(self, batch, batch_idx):
        if self.fail_at is not None and self.global_rank == 1 and batch_idx == self.fail_at:
            raise ValueError(f"bad batch {batch_idx} on rank 1")
        x, y, _ = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        rank = torch.tensor(float(self.global_rank), dtype=torch.float64)
        # per step, so the value is this step's rank reduced over the ranks
        self.log("rank_sum", rank, on_step=True, on_epoch=False, sync_dist=True, reduce_fx="sum")
        self.log("rank_max", rank, on_step=True, on_epoch=False, sync_dist=True, reduce_fx="max")
        return loss

    def _eval(self, batch, name):
        x, y, _ = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log(name, loss, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._eval(batch, "val_loss")
        x, y, _ = batch
        self.val_mean.update(torch.nn.functional.cross_entropy(self.net(x), y, reduction="none"))
        self.log("val_metric_mean", self.val_mean)

    def test_step(self, batch, batch_idx):
        self._eval(batch, "test_loss")

    def predict_step(self, batch, batch_idx):
        x, _, i = batch
        return i, self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


class ManualModel(Model):
    """Manual optimization: zero_grad/manual_backward/step on the LightningOptimizer, whose
    DistributedOptimizer methods must act on the real optimizer."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y, _ = batch
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.cross_entropy(self.net(x), y))
        opt.step()


class ExplicitSyncModel(ManualModel):
    """Horovod's pattern: synchronize, clip, then step inside skip_synchronize() - the
    gradients must be reduced once (op=Sum would show a second reduction)."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y, _ = batch
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.cross_entropy(self.net(x), y))
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1e9)  # reads the reduced gradients
        with opt.skip_synchronize():
            opt.step()


def reference(steps: int, lr: float = LR) -> dict:
    """One process, plain torch, on the global batch: what every rank must end with."""
    net, data = make_net(), Data(SAMPLES, 0)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM)
    for s in range(steps):
        # Lightning shuffles training data with torch's DistributedSampler (seed 0, set_epoch
        # each epoch): rank r takes every n-th index of one permutation of the epoch, so one
        # step of all ranks covers GLOBAL_BATCH consecutive indices of that permutation.
        epoch, lo = divmod(s * GLOBAL_BATCH, SAMPLES)
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))
        batch = order[lo:lo + GLOBAL_BATCH]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(data.x[batch]), data.y[batch]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def trainer(strategy, **kw) -> pl.Trainer:
    kw.setdefault("max_epochs", 1)
    return pl.Trainer(strategy=strategy, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, **kw)


def loader(n: int, seed: int, batch: int) -> DataLoader:
    return DataLoader(Data(n, seed), batch_size=batch, shuffle=False)


def assert_close(name: str, got: dict, want: dict) -> None:
    worst = 0.0
    for k, w in want.items():
        g = got[k].detach().cpu()
        worst = max(worst, float((g - w).norm() / w.norm()))
    assert worst < 1e-6, f"rank {hvd.rank()}: {name}: relative error {worst:.3g}"
    print(f"rank {hvd.rank()}: CHECK {name} ok (max relative error {worst:.2g})")


def check(name: str, ok: bool, detail) -> None:
    assert ok, f"rank {hvd.rank()}: {name}: {detail}"
    print(f"rank {hvd.rank()}: CHECK {name} ok")


def net_state(model: Model) -> dict:
    return {k: v for k, v in model.net.state_dict().items()}


def other_stages(t: pl.Trainer, model: Model, want: dict) -> None:
    """validate, test and predict with the fitted model; torchmetrics; manual optimization."""
    n, per_rank = hvd.size(), GLOBAL_BATCH // hvd.size()
    val = Data(4 * GLOBAL_BATCH, 7)
    full = float(torch.nn.functional.cross_entropy(model.net(val.x), val.y))
    for stage, key in ((t.validate, "val_loss"), (t.test, "test_loss")):
        result = stage(model, loader(len(val), 7, 4), verbose=False)
        check(key, abs(result[0][key] - full) < 1e-9 * abs(full), (result, full))
        if key == "val_loss":
            # the mean over every rank's samples (logged in float32), not this rank's own
            got = result[0]["val_metric_mean"]
            own = float(torch.nn.functional.cross_entropy(model.net(val.x[hvd.rank()::n]),
                                                          val.y[hvd.rank()::n]))
            check("torchmetrics_synced", abs(got - full) < 1e-6 * abs(full) and
                  abs(own - full) > 1e-4 * abs(full), (got, full, own))
    rows = torchmetrics.CatMetric(**hl.metric_sync_kwargs())
    rows.update(torch.full((hvd.rank() + 1,), float(hvd.rank())))  # ranks with different rows
    want_rows = [float(r) for r in range(n) for _ in range(r + 1)]
    check("torchmetrics_uneven_states", rows.compute().tolist() == want_rows, rows.compute())

    out = t.predict(model, loader(len(val), 7, 4))
    idx = torch.cat([i for i, _ in out])
    preds = torch.cat([p for _, p in out])
    with torch.no_grad():
        check("predict_outputs", torch.allclose(preds, model.net(val.x[idx])), idx)
    every = t.strategy.all_gather(idx)
    check("predict_covers_the_data", sorted(every.flatten().tolist()) == list(range(len(val))),
          every)

    manual = ManualModel()
    trainer("horovodlite").fit(manual, loader(SAMPLES, 0, per_rank))
    assert_close("manual_optimization_equals_one_process", net_state(manual), want)

    # op=Sum: the summed gradient is n times the mean, so the steps are those of lr * n
    explicit = ExplicitSyncModel()
    trainer(HorovodLiteStrategy(op=hvd.Sum)).fit(explicit, loader(SAMPLES, 0, per_rank))
    assert_close("explicit_synchronize_reduces_once", net_state(explicit),
                 reference(STEPS, lr=LR * n))


def fit_job(ckpt: str, then_raise: bool, core_only: bool, resume_from: str | None) -> None:
    n = hvd.size()
    per_rank = GLOBAL_BATCH // n
    model = Model()
    t = trainer("horovodlite", accumulate_grad_batches=2)
    check("registry", isinstance(t.strategy, hl.HorovodLiteStrategy), type(t.strategy))
    t.fit(model, loader(SAMPLES, 0, per_rank // 2))
    check("steps", t.global_step == STEPS, t.global_step)
    want = reference(STEPS)
    assert_close("fit_equals_one_process", net_state(model), want)

    m = t.callback_metrics
    check("sync_dist_sum", float(m["rank_sum"]) == n * (n - 1) / 2, m["rank_sum"])
    check("sync_dist_max", float(m["rank_max"]) == n - 1, m["rank_max"])
    local = torch.tensor(float(m["train_loss"]), dtype=torch.float64)
    spread = hvd.allgather(local.unsqueeze(0))
    check("sync_dist_mean_same_everywhere", bool((spread == spread[0]).all()), spread)

    t.save_checkpoint(ckpt)  # rank 0 writes; Lightning's barrier follows
    check("checkpoint_written", os.path.exists(ckpt), ckpt)

    if not core_only:
        other_stages(t, model, want)

    ddp_model = Model()
    ddp = pl.strategies.DDPStrategy(cluster_environment=hl.HorovodLiteEnvironment(),
                                    process_group_backend="gloo")
    td = trainer(ddp, accumulate_grad_batches=2, devices=hvd.local_size(),
                 num_nodes=hvd.cross_size())
    td.fit(ddp_model, loader(SAMPLES, 0, per_rank // 2))
    assert_close("fit_equals_ddp", net_state(model), net_state(ddp_model))

    if resume_from:
        resume(resume_from)
    check("all_phases", True, "")
    if then_raise:
        trainer("horovodlite").fit(Model(fail_at=3), loader(SAMPLES, 0, per_rank))


def save_job(ckpt: str) -> None:
    """20 steps at this job's number of ranks, then the checkpoint another job resumes."""
    model = Model()
    t = trainer("horovodlite")
    t.fit(model, loader(SAMPLES, 0, GLOBAL_BATCH // hvd.size()))
    check("saved_steps", t.global_step == STEPS, t.global_step)
    assert_close(f"save_at_np{hvd.size()}_equals_one_process", net_state(model), reference(STEPS))
    t.save_checkpoint(ckpt)
    check("checkpoint_written", os.path.exists(ckpt), ckpt)


def resume(ckpt: str) -> None:
    """A second epoch from ``ckpt`` (saved at another number of ranks): 40 steps in all."""
    model = Model()
    t = trainer(HorovodLiteStrategy(), max_epochs=2)
    t.fit(model, loader(SAMPLES, 0, GLOBAL_BATCH // hvd.size()), ckpt_path=ckpt)
    check("resumed_steps", t.global_step == 2 * STEPS, t.global_step)
    assert_close(f"resume_at_np{hvd.size()}_equals_one_process", net_state(model),
                 reference(2 * STEPS))


HorovodLiteStrategy = hl.HorovodLiteStrategy

if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    hvd.init()
    if mode == "fit":
        resume_from = sys.argv[sys.argv.index("--resume") + 1] if "--resume" in sys.argv else None
        fit_job(path, "--raise" in sys.argv, "--core" in sys.argv, resume_from)
    else:
        save_job(path)
    print(f"rank {hvd.rank()}: DONE", flush=True)
