"""The entries a refit changed, as a ``ProfileUpdate`` with provenance (pure; see
``plansim.validate.refit``)."""

from __future__ import annotations

from plansim.io.profile_extras import host_overhead_keys
from plansim.io.profiles import SCALAR_KEYS, ProfileUpdate
from plansim.specs.hardware import HardwareProfile

#: Factor names (``Refit.factors``) behind each host_overhead key.
_HOST_FACTORS = {
    "forward_op_us": "host_overhead",
    "backward_op_us": "host_overhead",
    "dtensor_forward_op_us": "host_overhead.dtensor_forward",
    "dtensor_backward_op_us": "host_overhead.dtensor_backward",
    "pipeline_action_forward_us": "host_overhead.pipeline_action",
    "pipeline_action_backward_us": "host_overhead.pipeline_action",
    "sac_forward_op_us": "host_overhead",
    "sac_backward_op_us": "host_overhead",
}


def profile_update(
    base: HardwareProfile,
    fitted: HardwareProfile,
    factors: dict[str, float],
    *,
    dtype: str,
    source: str,
) -> ProfileUpdate:
    """The entries of ``fitted`` that differ from ``base``, each with provenance ``source``.

    Args:
        source: e.g. ``"refit by plansim validate, 2026-01-31: tp1 pp2 dp1 ... (gloo, 2
            ranks, model tiny)"``; the time multiplier of each term is appended.
    """
    scalars: dict[str, float] = {}
    provenance: dict[str, str] = {}
    for name in ("hbm_efficiency_fraction", "hbm_bytes_per_s", "kernel_launch_s"):
        if getattr(fitted, name) != getattr(base, name):
            scalars[name] = getattr(fitted, name)
    term = {
        "hbm_efficiency_fraction": "streaming",
        "hbm_bytes_per_s": "streaming",
        "kernel_launch_s": "gemm_and_launch",
    }
    for name in scalars:
        provenance[SCALAR_KEYS[name]] = _note(source, factors.get(term[name]))
    peaks = {}
    curves = {}
    if fitted.matmul_efficiency[dtype] != base.matmul_efficiency[dtype]:
        curves[dtype] = fitted.matmul_efficiency[dtype]
        provenance[f"matmul_efficiency.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    if fitted.peak_flops_per_s[dtype] != base.peak_flops_per_s[dtype]:
        peaks[dtype] = fitted.peak_flops_per_s[dtype]
        provenance[f"peak_tflops.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    intra = {}
    for name, coll in fitted.intra_node.items():
        if coll != base.intra_node[name]:
            intra[name] = coll
            note = _note(source, factors.get(f"intra_node.{name}"))
            provenance[f"intra_node.{name}"] = provenance[f"intra_node.{name}.latency_us"] = note
    attention = {}
    if dtype in fitted.attention_efficiency and (
        fitted.attention_efficiency[dtype] != base.attention_efficiency.get(dtype)
    ):
        attention[dtype] = fitted.attention_efficiency[dtype]
        provenance[f"attention_efficiency.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    host = None
    if fitted.host_overhead is not None and fitted.host_overhead != base.host_overhead:
        host = fitted.host_overhead
        for key in host_overhead_keys(host):
            old = base.provenance.get(f"host_overhead.{key}", source)
            factor = factors.get(_HOST_FACTORS.get(key, ""))
            changed = factor is not None and factor != 1.0
            provenance[f"host_overhead.{key}"] = _note(source, factor) if changed else old
    return ProfileUpdate(
        peak_flops_per_s=peaks,
        matmul_efficiency=curves,
        intra_node=intra,
        scalars=scalars,
        provenance=provenance,
        attention_efficiency=attention,
        host_overhead=host,
    )


def _note(source: str, factor: float | None) -> str:
    return source if factor is None else f"{source}; times x{factor:.4g} of the previous value"
