"""PyTorch Lightning training over horovodlite: a small MLP on scikit-learn's bundled 8x8 digits
(no download), with HorovodLiteStrategy.

Shows the Lightning recipe: a plain LightningModule and DataLoaders (Lightning adds the
DistributedSampler), Trainer(strategy=HorovodLiteStrategy()) - or strategy="horovodlite" once
horovodlite.lightning is imported - validation metrics logged with sync_dist=True (averaged over
the ranks), a ModelCheckpoint that rank 0 writes, and trainer.test on the best checkpoint.
Gradients are averaged by hvd.DistributedOptimizer while backward runs; accumulate_grad_batches
maps to its backward_passes_per_step. Reaches about 95-98 % test accuracy in a few seconds on
two CPU cores. With --cuda each rank trains on its own GPU (hvd.local_device()).

Run:  horovodliterun -np 2 python examples/lightning_digits.py
      horovodliterun --gloo -np 2 python examples/lightning_digits.py
      torchrun --nproc_per_node=2 examples/lightning_digits.py
      horovodliterun -np 2 python examples/lightning_digits.py --cuda --epochs 20
Needs: pip install 'horovodlite[lightning]' scikit-learn
With the unified lightning package, the same script imports lightning.pytorch as pl and the
strategy from horovodlite.lightning.pytorch.
"""

import argparse
import tempfile
import warnings

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import horovodlite.torch as hvd
from horovodlite.lightning import HorovodLiteStrategy

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class Digits(pl.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128),
                                       torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def _evaluate(self, batch, stage):
        x, y = batch
        logits = self.net(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{stage}_acc", (logits.argmax(1) == y).double().mean(), sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def loaders(batch_size: int):
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True)
    test = DataLoader(TensorDataset(x_test, y_test), batch_size=batch_size)
    return train, test


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--cuda", action="store_true", help="one GPU per rank")
    args = p.parse_args()

    hvd.init()  # optional here (the strategy starts horovodlite), but hvd.rank() needs it
    pl.seed_everything(0, verbose=False)
    train, test = loaders(args.batch_size)
    # every rank must write to the same folder: rank 0 picks it
    folder = hvd.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="val_acc", mode="max")
    trainer = pl.Trainer(strategy=HorovodLiteStrategy(), accelerator="gpu" if args.cuda else "cpu",
                         max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
                         callbacks=[checkpoint], logger=False, enable_progress_bar=False,
                         enable_model_summary=hvd.rank() == 0)
    trainer.fit(Digits(args.lr), train, test)
    result = trainer.test(ckpt_path="best", dataloaders=test, verbose=False)[0]
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, best checkpoint {checkpoint.best_model_path}: "
              f"test accuracy {result['test_acc']:.3f}, test loss {result['test_loss']:.3f}")


if __name__ == "__main__":
    main()
