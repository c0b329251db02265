"""The cluster's inter-node network as an input: NICs per node and their line rate (pure).

A hardware profile describes a GPU kind in its usual node (a DGX A100: one 200 Gb/s HDR NIC
per GPU). Clusters differ: BLOOM's Jean Zay nodes had 4 x 100 Gb/s Omni-Path links per 8
A100s (the BLOOM model card, bigscience/bloom "Training" section), an eighth of a DGX's
inter-node bandwidth per GPU. :func:`with_node_nics` replaces the profile's per-GPU NIC
bandwidth (``HardwareProfile.nic_bytes_per_s``: one direction, one GPU's share) by what the
stated NICs give each GPU when every GPU of the node sends at once (as the DP, PP and CP
collectives of a synchronous step do):

    nic_bytes_per_s = nics_per_node x line rate x NIC_EFFICIENCY_FRACTION / gpus_per_node

``NIC_EFFICIENCY_FRACTION`` is the share of the line rate NCCL reaches per NIC, 0.94: the
NCCL maintainer's 46-48 GB/s for a 400 Gb/s NDR NIC (../shared/reference N14), the figure the
shipped profiles derive their ``nic_gb_per_s`` from. Applied to every fabric (InfiniBand,
Omni-Path, RoCE) alike: ../shared/reference measures no other fabric (an assumption). The
latency (``nic_latency_s``) and the multi-node curve shapes are kept.
"""

from __future__ import annotations

import dataclasses

from plansim.errors import SpecError
from plansim.specs.hardware import HardwareProfile

#: Fraction of a NIC's line rate NCCL reaches (N14: 46-48 of 50 GB/s on NDR; midpoint 0.94).
NIC_EFFICIENCY_FRACTION = 0.94
#: Bits per byte, for line rates stated in Gb/s.
BITS_PER_BYTE = 8


def node_nic_bytes_per_s(
    profile: HardwareProfile, *, nics_per_node: int, nic_line_bits_per_s: float
) -> float:
    """Inter-node bytes/s per GPU that ``nics_per_node`` NICs of ``nic_line_bits_per_s`` each
    give the profile's ``gpus_per_node`` GPUs (module formula).

    Raises:
        SpecError: ``nics_per_node`` not a positive integer, or the line rate not a positive
            finite number.
    """
    if type(nics_per_node) is not int or nics_per_node < 1:
        raise SpecError(f"nics_per_node must be a positive integer, got {nics_per_node!r}")
    rate = nic_line_bits_per_s
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < float("inf"):
        raise SpecError(f"NIC line rate must be a positive number of bits/s, got {rate!r}")
    line_bytes_per_s = nics_per_node * rate / BITS_PER_BYTE
    return line_bytes_per_s * NIC_EFFICIENCY_FRACTION / profile.gpus_per_node


def with_node_nics(
    profile: HardwareProfile, *, nics_per_node: int, nic_line_bits_per_s: float
) -> HardwareProfile:
    """``profile`` with its per-GPU NIC bandwidth from the stated NICs
    (:func:`node_nic_bytes_per_s`); everything else unchanged.

    Raises:
        SpecError: as :func:`node_nic_bytes_per_s`.
    """
    per_gpu = node_nic_bytes_per_s(
        profile, nics_per_node=nics_per_node, nic_line_bits_per_s=nic_line_bits_per_s
    )
    return dataclasses.replace(profile, nic_bytes_per_s=per_gpu)
