"""Tile tuning: the cube's L0 tile model (``l0_tile``, :mod:`.l0`) and the tile search
(``search``, :mod:`.search`).

``l0_tile(M, N, K)`` picks one cube task's L0 tile the way PyPTO's ``ChooseL0Tile`` does
(npu-facts 8.2); ``search(op, **scenario)`` ranks every legal tile shape of an op's strategies by
the pipe model's NPU-time estimate.
"""

from .l0 import ACC_BYTES, DBCS, STATIONARITIES, L0Tile, isa_mad_cycles, l0_tile
from .search import Search, Tuned, search

__all__ = ["ACC_BYTES", "DBCS", "STATIONARITIES", "L0Tile", "Search", "Tuned", "isa_mad_cycles", "l0_tile",
           "search"]
