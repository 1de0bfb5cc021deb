"""``HorovodLiteEnvironment``: Lightning's view of a horovodlite job (a ``ClusterEnvironment`` of
``pytorch_lightning``'s hierarchy; what it does is in ``horovodlite.lightning.logic``).

Rank, size, local rank and node are horovodlite's; ``main_address``/``main_port`` (for a
``DDPStrategy`` inside a horovodlite job) are chosen by rank 0 and broadcast.
"""

from __future__ import annotations

from lightning_fabric.plugins.environments import ClusterEnvironment

from horovodlite.lightning.logic import EnvironmentLogic


class HorovodLiteEnvironment(EnvironmentLogic, ClusterEnvironment):
    __doc__ = EnvironmentLogic.__doc__
