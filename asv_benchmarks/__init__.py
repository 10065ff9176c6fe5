"""airspeed-velocity benchmarks for pypto_numba (see ../asv.conf.json; helpers in _common.py)."""
