"""horovodlite.lightning: PyTorch Lightning 2.x training over horovodlite.

    from horovodlite.lightning import HorovodLiteStrategy
    trainer = pl.Trainer(strategy=HorovodLiteStrategy(), accelerator="cpu", max_epochs=3)
    # or, after `import horovodlite.lightning`: pl.Trainer(strategy="horovodlite", ...)

run under a launcher: ``horovodliterun -np 4 python train.py`` (or ``--gloo``), ``torchrun``,
``srun``. These classes are ``pytorch_lightning``'s; for the unified ``lightning`` package
(``lightning.pytorch.Trainer``) import them from ``horovodlite.lightning.pytorch``. Needs
``pip install 'horovodlite[lightning]'`` (pytorch-lightning and lightning 2.6).
"""

try:
    import pytorch_lightning  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "horovodlite.lightning needs PyTorch Lightning: pip install 'horovodlite[lightning]' "
        "(pytorch-lightning>=2.6,<2.7)"
    ) from exc

from pytorch_lightning.strategies import StrategyRegistry

from horovodlite.lightning.environment import HorovodLiteEnvironment
from horovodlite.lightning.metrics import metric_sync_kwargs
from horovodlite.lightning.strategy import HorovodLiteStrategy

HorovodLiteStrategy.register_strategies(StrategyRegistry)

__all__ = ["HorovodLiteStrategy", "HorovodLiteEnvironment", "metric_sync_kwargs"]
