"""Former home of the attention strategies' shared pieces, now split by concern: ``validation``
(argument checks, the call memo), ``plans`` (plan helpers), ``tasks`` (task decomposition),
``tiles`` (the tile bodies) and ``gqa_clone`` (gqa="expand_clone"). Kept for ``_CALLS``, which
tests/test_calls.py clears."""

from .validation import _CALLS  # noqa: F401
