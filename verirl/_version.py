"""verirl's version, in a module of its own so that any module can import it without a cycle."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
