"""Frozen, validated specs: ModelSpec, ParallelPlan, HardwareProfile."""

from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile, LinkTier
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import AttentionKernel, ParallelPlan, Precision, Recompute, Schedule

__all__ = [
    "Activation",
    "AttentionKernel",
    "CollectiveCurve",
    "Curve",
    "HardwareProfile",
    "LinkTier",
    "ModelSpec",
    "Normalization",
    "ParallelPlan",
    "PositionEmbedding",
    "Precision",
    "Recompute",
    "Schedule",
]
