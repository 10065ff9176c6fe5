"""The lab layer: what compare, advise and report need to know about an op, declared once per op.

An op module ends with ``OP = OpSpec(...)`` (see :mod:`.spec`); compare, advise, report and the
CLI read those specs and hold no per-op code.
"""

from .spec import Candidate, Inputs, OpSpec, Seed, Tolerance, Variant, need, normal

__all__ = ["Candidate", "Inputs", "OpSpec", "Seed", "Tolerance", "Variant", "need", "normal"]
