"""epx's version: the one place it is written (pyproject.toml reads it; CMake checks it)."""
__version__ = "0.1.0"
