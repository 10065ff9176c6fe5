"""``python -m pypto_numba`` is the ``pypto-numba`` command."""

import sys

from .cli import main

sys.exit(main())
