"""Named regions carved out of one per-thread scratch slab (the slab itself: ``tile.scratch``).

A kernel that needs several per-thread buffers gets one slab per thread and slices it into
regions. :class:`Regions` names the regions in slab order; :meth:`Regions.carve` takes their sizes
and gives both the slab's element count (what ``tile.scratch`` is sized with) and the bounds the
kernel slices with, so no offset is computed twice::

    SCRATCH = Regions("scores", "probs")
    SCORES, PROBS = SCRATCH.indices
    layout = SCRATCH.carve(scores=R * n, probs=R * n)
    slab = tile.scratch(layout.total, np.float32)
    kernel(..., slab, layout.bounds)

    # in the kernel, once per task (module-level ints are compile-time constants in numba):
    sc = slab[numba.get_thread_id()]
    s = sc[bounds[SCORES]:bounds[SCORES + 1]]
"""

from __future__ import annotations

import numpy as np


class Carved:
    """Regions of one slab: ``bounds[i] .. bounds[i + 1]`` is region i (int64), ``total`` its size."""

    __slots__ = ("names", "bounds", "total")

    def __init__(self, names, sizes):
        self.names = names
        bounds = [0]
        for n in sizes:
            bounds.append(bounds[-1] + int(n))
        self.bounds = np.array(bounds, dtype=np.int64)
        self.total = bounds[-1]

    def offset(self, name) -> int:
        return int(self.bounds[self.names.index(name)])

    def __repr__(self):
        return "Carved(" + ", ".join(
            f"{n}=[{self.bounds[i]}:{self.bounds[i + 1]}]" for i, n in enumerate(self.names)) + ")"


class Regions:
    """The names of a slab's regions, in slab order."""

    def __init__(self, *names: str):
        if len(set(names)) != len(names):
            raise ValueError(f"region names repeat: {names}")
        self.names = names

    @property
    def indices(self):
        """0 .. n-1, one per region in order (unpack them into the kernel's module constants)."""
        return tuple(range(len(self.names)))

    def carve(self, **sizes) -> Carved:
        """Bounds and total for these region sizes (elements; every region named exactly once)."""
        if set(sizes) != set(self.names):
            raise ValueError(f"sizes {sorted(sizes)} do not name the regions {self.names}")
        return Carved(self.names, [sizes[n] for n in self.names])
