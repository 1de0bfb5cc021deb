"""horovodlite.keras: Horovod's Keras API (``horovod.keras`` / ``horovod.tensorflow.keras``)
for Keras 3 on its torch backend.

    import horovodlite.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

run under a launcher: ``horovodliterun -np 4 python train.py``, ``torchrun``, ``srun``. Needs
``pip install 'horovodlite[keras]'`` (keras 3.15, the release the tests ran with). Keras must
run on the torch backend: importing this module before Keras selects it unless
``KERAS_BACKEND`` names another one, and on any other backend the import fails saying so.
"""

import os
import sys

if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
    _backend = sys.modules["keras"].backend.backend()
else:
    _backend = os.environ.setdefault("KERAS_BACKEND", "torch")
if _backend != "torch":
    raise ImportError(
        f"horovodlite.keras runs Keras 3 on its torch backend, but Keras uses '{_backend}': set "
        "KERAS_BACKEND=torch before Keras is imported (or import horovodlite.keras first)")

try:
    import keras  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("horovodlite.keras needs Keras 3: pip install 'horovodlite[keras]' "
                      f"(keras>=3.15,<3.16); importing it failed: {exc}") from exc

from horovodlite.keras import callbacks  # noqa: E402
from horovodlite.keras.functions import (  # noqa: E402
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
    load_model,
)
from horovodlite.keras.optimizer import DistributedOptimizer  # noqa: E402
from horovodlite.torch import (  # noqa: E402
    Average,
    Compression,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    allgather_object,
    broadcast_object,
    cross_rank,
    cross_size,
    global_process_set,
    gloo_enabled,
    init,
    is_initialized,
    local_device,
    local_rank,
    local_size,
    mpi_enabled,
    rank,
    shutdown,
    size,
)

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "local_device",
    "cross_size", "cross_rank", "mpi_enabled", "gloo_enabled", "HorovodInternalError",
    "Average", "Sum", "Min", "Max", "Product", "Compression", "ProcessSet", "global_process_set",
    "DistributedOptimizer", "allreduce", "allgather", "broadcast", "broadcast_variables",
    "broadcast_object", "allgather_object", "load_model", "callbacks",
]
