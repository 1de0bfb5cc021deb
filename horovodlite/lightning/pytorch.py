"""horovodlite.lightning for the unified ``lightning`` package (``lightning.pytorch``).

``lightning.pytorch`` is a second copy of ``pytorch_lightning`` with its own classes: its
``Trainer`` takes only strategies that subclass *its* ``ParallelStrategy``. This module gives
the same strategy and environment on those bases (the behaviour is
``horovodlite.lightning.logic``'s, shared with the ``pytorch_lightning`` classes)::

    import lightning.pytorch as L
    from horovodlite.lightning.pytorch import HorovodLiteStrategy
    trainer = L.Trainer(strategy=HorovodLiteStrategy(), accelerator="cpu", max_epochs=3)
    # or, once this module is imported: L.Trainer(strategy="horovodlite", ...)

Needs ``pip install 'horovodlite[lightning]'`` (lightning 2.6).
"""

try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # depends on the environment (tests/test_lightning.py checks it)
    raise ImportError(
        "horovodlite.lightning.pytorch needs the 'lightning' package (lightning.pytorch): "
        "pip install 'horovodlite[lightning]' (lightning>=2.6,<2.7); for pytorch_lightning "
        "use horovodlite.lightning"
    ) from exc

from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry

from horovodlite.lightning.logic import EnvironmentLogic, StrategyLogic
from horovodlite.lightning.metrics import metric_sync_kwargs


class HorovodLiteEnvironment(EnvironmentLogic, ClusterEnvironment):
    __doc__ = EnvironmentLogic.__doc__


class HorovodLiteStrategy(StrategyLogic, ParallelStrategy):
    __doc__ = StrategyLogic.__doc__
    environment_class = HorovodLiteEnvironment


HorovodLiteStrategy.register_strategies(StrategyRegistry)

__all__ = ["HorovodLiteStrategy", "HorovodLiteEnvironment", "metric_sync_kwargs"]
