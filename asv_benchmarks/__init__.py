"""airspeed-velocity benchmarks for pypto_numba (see ../asv.conf.json; helpers in _common.py).

asv installs the project into its environments; with ``--python=same`` (smoke runs, CI's
``asv check``) it uses the current interpreter, which may not have the project installed, and asv
strips PYTHONPATH. In that case the repository checkout this suite lives in is put on sys.path.
"""

import importlib.util
import os
import sys

if importlib.util.find_spec("pypto_numba") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
