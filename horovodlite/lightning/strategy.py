"""``HorovodLiteStrategy`` for ``pytorch_lightning``: ``pl.Trainer(strategy=HorovodLiteStrategy())``
(``horovodlite.lightning.pytorch`` has the same for the ``lightning`` package's
``lightning.pytorch``). What it does, hook by hook, is in ``horovodlite.lightning.logic``.
"""

from __future__ import annotations

from pytorch_lightning.strategies import ParallelStrategy

from horovodlite.lightning.environment import HorovodLiteEnvironment
from horovodlite.lightning.logic import StrategyLogic


class HorovodLiteStrategy(StrategyLogic, ParallelStrategy):
    __doc__ = StrategyLogic.__doc__
    environment_class = HorovodLiteEnvironment
