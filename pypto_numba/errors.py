"""Exceptions raised by pypto_numba.

All of them are ``ValueError`` subclasses sharing the base :class:`PyptoNumbaError`, so callers
can catch one family. Messages name the op and strategy, the offending value, the limit, and a
way out. Out-of-range indices raise the built-in ``IndexError``.
"""

from __future__ import annotations


class PyptoNumbaError(ValueError):
    """Base class of every pypto_numba error."""


class TileError(PyptoNumbaError):
    """A buffer does not fit the hardware profile, or a tile breaks an alignment or rank rule."""


class ConstraintError(PyptoNumbaError):
    """A PyPTO dtype or shape constraint is violated (what the NPU compiler would refuse)."""


class ShapeError(PyptoNumbaError):
    """Input shapes are wrong or inconsistent."""


class DTypeError(PyptoNumbaError, TypeError):
    """An input has an unsupported dtype."""


class ConfigError(PyptoNumbaError):
    """A model config has inconsistent or missing fields, or a setting (an environment variable)
    has a value it does not take; the message names the field or the variable."""
