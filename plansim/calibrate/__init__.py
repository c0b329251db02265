"""Calibration: measure hardware and turn measurements into a hardware profile.

Two sources feed a profile (``hardware_profiles/README.md`` has the schema):

* ``plansim calibrate``: torch microbenchmarks on this machine (GEMM sweep, attention,
  streaming kernels, per-op overhead, host Adam step, collectives through
  ``torch.distributed``), run by ranks this package launches (:mod:`.launch`, :mod:`.bench`).
* ``plansim profiles import-nccl-tests``: logs of NVIDIA's nccl-tests (:mod:`.nccl_tests`).

Only :mod:`.bench` (and its :mod:`.bench_host`), :mod:`.op_sac`, :mod:`.launch` and
:mod:`.runner` import torch. The parser, the fitting
(:mod:`.fit`), the measurement plan (:mod:`.plan`), the raw-measurement CSV (:mod:`.raw`) and
the profile builder (:mod:`.build`) are pure (numpy/pandas) and importable without torch.
"""

from __future__ import annotations

from plansim.errors import PlansimError


class CalibrationError(PlansimError):
    """A calibration run could not finish (a rank failed, timed out, or the input is bad)."""
