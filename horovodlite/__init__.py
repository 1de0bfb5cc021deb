"""horovodlite: Horovod-style distributed data-parallel training for PyTorch.

Use it as a drop-in for Horovod::

    import horovodlite.torch as hvd
    hvd.init()
"""

__version__ = "0.1.0"
