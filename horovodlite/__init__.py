"""horovodlite: Horovod-style distributed data-parallel training for PyTorch.

Use it as a drop-in for Horovod::

    import horovodlite.torch as hvd
    hvd.init()
"""

from horovodlite._version import __version__

__all__ = ["__version__"]
