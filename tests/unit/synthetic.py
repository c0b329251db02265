"""The round-number synthetic profile: 100 TFLOP/s, 100 GB/s, 10 us (docs/architecture.md)."""

from __future__ import annotations

import dataclasses

from plansim.catalog import resolve_model
from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import Activation, ModelSpec

#: A 4-layer, 64-wide GPT-style model small enough for by-hand oracles.
TINY_MODEL = ModelSpec(
    name="tiny",
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=4,
    ffn_hidden_size=256,
    activation=Activation.GELU,
    seq_length=32,
    vocab_size=128,
    tied_embeddings=False,
)

#: Small models of the validate model's two families, for tests that build or count them:
#: GPT-3's shape (GELU, MHA, learned positions, biases, tied embeddings) and Llama 3's
#: (SwiGLU, RoPE, GQA, RMSNorm, no biases, untied), 4 layers of width 64.
SMALL_GPT = dataclasses.replace(
    resolve_model("gpt3-175b"),
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=4,
    ffn_hidden_size=256,
    seq_length=16,
    vocab_size=128,
)
SMALL_LLAMA = dataclasses.replace(
    resolve_model("llama3-8b"),
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=128,
    seq_length=16,
    vocab_size=128,
)


def round_profile(*, gpus_per_node: int = 8, hbm_gib: float = 80.0) -> HardwareProfile:
    """Flat curves: every GEMM at 100 TFLOP/s, HBM 1000 GB/s, collectives 100 GB/s busbw with
    10 us latency, NIC 10 GB/s with 5 us, no launch overhead, no reserve."""
    flat = Curve(x=(1.0,), y=(1.0,), source="synthetic")
    bw = Curve(x=(1.0,), y=(100e9,), source="synthetic")
    intra = {
        c: CollectiveCurve(collective=c, latency_s=10e-6, busbw_bytes_per_s=bw)
        for c in ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
    }
    return HardwareProfile(
        name="round-numbers",
        description="synthetic round-number profile for tests",
        peak_flops_per_s={"bf16": 100e12, "fp16": 100e12},
        matmul_efficiency={"bf16": flat, "fp16": flat},
        hbm_capacity_bytes=hbm_gib * 2**30,
        hbm_bytes_per_s=1000e9,
        hbm_efficiency_fraction=1.0,
        memory_reserve_bytes=0.0,
        gpus_per_node=gpus_per_node,
        intra_node=intra,
        nic_bytes_per_s=10e9,
        nic_latency_s=5e-6,
        pcie_bytes_per_s=25e9,
        kernel_launch_s=0.0,
    )


def profile_dict_provenance_keys(data: dict) -> list[str]:  # type: ignore[type-arg]
    """Dotted keys that need a provenance entry in ``data`` (a ``profile_to_dict`` of a
    profile without optional sections): its scalars, peaks, matmul curves and collectives."""
    keys = [k for k in data if k.endswith(("_us", "_gib", "_gb_per_s", "_fraction"))]
    keys += ["gpus_per_node"]
    keys += [f"peak_tflops.{d}" for d in data["peak_tflops"]]
    keys += [f"matmul_efficiency.{d}" for d in data["matmul_efficiency"]]
    for name in data["intra_node"]:
        keys += [f"intra_node.{name}", f"intra_node.{name}.latency_us"]
    return keys
