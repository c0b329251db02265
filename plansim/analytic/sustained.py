"""The GEMM rate a synchronous training job sustains: power limit and slowest GPU.

Pure. The profile's ``matmul_efficiency`` (and ``attention_efficiency``) ceilings are
single-GPU measurements of a short GEMM loop (MAMF: the mean of 100 iterations after 50
warm-up ones, ../shared/reference H04). A training job differs in two measured ways:

* **Power limit.** A GPU that runs GEMMs for minutes draws its power limit and lowers its
  clock, more so with random operands than with regular ones (Horace He 2024, "Strangely,
  Matrix Multiplications on GPUs Run Faster When Given 'Predictable' Data": cuBLAS
  8192^3 on A100 at 400 W, 295 TFLOP/s with zeros and 257-258 with ``torch.randn``). The
  profile states the ratio as ``sustained_matmul_fraction``.
* **The slowest GPU sets the pace.** Sustained rates differ between GPUs of one kind
  (silicon lottery, cooling: Sinha et al., SC22, arXiv:2208.11035, 8% average variation
  across V100/MI60 clusters; S. Bekman, ml-engineering ``compute/accelerator``: 5% and more
  within one 8-GPU node, and on 8 x B200 / 8 x H200 with every GPU busy a 10.4% / 4.5%
  spread). Every step of a synchronous job (TP collectives per layer, pipeline sends, the DP
  gradient reduction) waits for its slowest GPU, so a job of N GPUs computes at the expected
  slowest of N draws. With per-GPU rates normal about the median with relative standard
  deviation sigma (``gpu_matmul_spread_fraction``), the expected slowest is
  ``median * (1 - sigma * z_N)``, z_N the expected largest of N standard normal draws, by
  Blom's (1958) approximation ``z_N = Phi^-1((N - 0.375) / (N + 0.25))`` (z_1 = 0,
  z_8 = 1.43, z_1024 = 3.23).

Both scale the compute-bound kernels only (GEMMs and fused attention); memory-bound kernels
move bytes at the HBM rate, which neither effect changes.

The power limit is reached by the tensor cores' dtypes only. Measured on an H100 SXM
(``benchmarks/bench_gpu_mechanisms.py``, 2026-11-27, torch 2.11 + CUDA 13, random 8192^3
operands, 15 s soak; ``benchmarks/gpu_runs/h100-2026-11-27/mechanisms.csv``): bf16 held
0.896 of its burst rate (752 -> 675 TFLOP/s), fp32 on the CUDA cores 0.9999 (51.45 TFLOP/s
both), so :data:`UNTHROTTLED_DTYPES` keep their burst curves. The spread between GPUs
(silicon, cooling) is not a power effect and applies to every dtype.
"""

from __future__ import annotations

import dataclasses
from statistics import NormalDist

from plansim.errors import SpecError
from plansim.specs.compute_terms import AttentionEfficiency
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile

#: Blom's (1958) plotting position constants for normal order statistics.
_BLOM_A = 0.375
_BLOM_B = 0.25


def expected_slowest_z(num_gpus: int) -> float:
    """Expected largest of ``num_gpus`` standard normal draws (Blom 1958): how many standard
    deviations the slowest GPU of a job sits below the median. 0 for one GPU.

    Raises:
        SpecError: ``num_gpus`` < 1.
    """
    if num_gpus < 1:
        raise SpecError(f"num_gpus must be >= 1, got {num_gpus}")
    if num_gpus == 1:
        return 0.0
    p = (num_gpus - _BLOM_A) / (num_gpus + _BLOM_B)
    return NormalDist().inv_cdf(p)


def slowest_gpu_fraction(profile: HardwareProfile, num_gpus: int) -> float:
    """Fraction of the median GPU's rate the slowest of ``num_gpus`` sustains:
    ``1 - gpu_matmul_spread_fraction * z_N`` (1.0 without a spread).

    Raises:
        SpecError: ``num_gpus`` < 1.
    """
    return 1.0 - profile.gpu_matmul_spread_fraction * expected_slowest_z(num_gpus)


def sustained_pace_fraction(profile: HardwareProfile, num_gpus: int) -> float:
    """Fraction of the profile's burst GEMM rate a synchronous job of ``num_gpus`` GPUs
    sustains: ``sustained_matmul_fraction * (1 - gpu_matmul_spread_fraction * z_N)``.

    1.0 for a profile with neither key (every CPU profile, and GPUs without measurements).

    Raises:
        SpecError: ``num_gpus`` < 1.
    """
    return profile.sustained_matmul_fraction * slowest_gpu_fraction(profile, num_gpus)


#: dtypes whose GEMMs run on the CUDA cores (no tensor cores), below the power limit: an
#: fp32 GEMM loop kept its burst rate over a 15 s soak on an H100 (module docstring).
UNTHROTTLED_DTYPES = frozenset({"fp32"})


def _scaled(curve: Curve, factor: float) -> Curve:
    """``curve`` with its values x ``factor`` (``dataclasses.replace``: a subclass, such as
    ``plansim.planner.lookups``' recording curve, stays one)."""
    return dataclasses.replace(curve, y=tuple(y * factor for y in curve.y))


def dtype_pace_fraction(profile: HardwareProfile, num_gpus: int, dtype: str) -> float:
    """:func:`sustained_pace_fraction` for GEMMs of ``dtype``: without the power-limit factor
    for :data:`UNTHROTTLED_DTYPES` (only the slowest-GPU spread).

    Raises:
        SpecError: ``num_gpus`` < 1.
    """
    if dtype in UNTHROTTLED_DTYPES:
        return slowest_gpu_fraction(profile, num_gpus)
    return sustained_pace_fraction(profile, num_gpus)


def job_compute_profile(profile: HardwareProfile, num_gpus: int) -> HardwareProfile:
    """``profile`` with its GEMM and fused-attention curves (and the Ampere-kernel attention
    cap) scaled to the rate a synchronous job of ``num_gpus`` GPUs sustains
    (:func:`dtype_pace_fraction` per dtype); the profile itself when the pace is 1.

    Raises:
        SpecError: ``num_gpus`` < 1.
    """
    factor = sustained_pace_fraction(profile, num_gpus)
    if factor == 1.0:
        return profile

    def pace(dtype: str) -> float:
        return dtype_pace_fraction(profile, num_gpus, dtype)

    return dataclasses.replace(
        profile,
        matmul_efficiency={d: _scaled(c, pace(d)) for d, c in profile.matmul_efficiency.items()},
        attention_efficiency={
            d: AttentionEfficiency(
                forward=_scaled(a.forward, pace(d)),
                backward=_scaled(a.backward, pace(d)),
                source=a.source,
            )
            for d, a in profile.attention_efficiency.items()
        },
        ampere_attention_fraction_of_peak=None
        if profile.ampere_attention_fraction_of_peak is None
        else profile.ampere_attention_fraction_of_peak * factor,
    )
