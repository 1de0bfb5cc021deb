"""horovodlite's version: the one place it is written. pyproject.toml reads it (a dynamic
version), and so do ``horovodlite.__version__``, ``horovodliterun --version`` and the docs."""

__version__ = "0.1.0"
