"""What a timer around one transformer layer measures: its forward and backward (pure).

Published per-layer timings (Korthikanti et al. 2022, Table 4: forward and backward ms of one
22B layer on 8 A100s with tp 8) time a layer's passes on the GPU that runs them, blocking
collectives included. In plansim's terms (``plansim.analytic.layer_cost.PassTimes``, on the
profile scaled to the pace a job of ``plan.num_gpus`` GPUs sustains,
``plansim.analytic.sustained.job_compute_profile``, as the simulator prices them):

    forward  = compute + TP collectives + exposed ring attention (cp)
    backward = recompute (full: the whole forward again with its TP collectives and ring;
               selective: the attention core) + input-gradient and weight-gradient compute
               + TP collectives + exposed ring attention

ZeRO-3 gathers, pipeline sends and the data-parallel gradient reduction happen between
layers or beside them and are not part of a layer's time. With the block method
(``recompute_num_layers``) only some layers re-run their forward; this gives the time of a
layer that does.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.analytic.sustained import job_compute_profile
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWallTimes:
    """Seconds one layer's forward and backward take for one micro-batch on one GPU."""

    forward_s: float
    backward_s: float


def layer_wall_times(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> LayerWallTimes:
    """Forward and backward seconds of one layer under ``plan`` (module docstring).

    Raises:
        SpecError: the plan does not fit the profile's nodes (``layout_groups``).
    """
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    job = job_compute_profile(profile, plan.num_gpus)
    t = layer_pass_times(model, plan, job, groups)
    forward = t.forward_s + t.tp_forward_s + t.cp_forward_s
    backward = t.backward_input_s + t.backward_weight_s + t.tp_backward_s + t.cp_backward_s
    # zero without recompute; selective re-runs no TP collective (tp_recompute_s 0)
    backward += t.recompute_s + t.tp_recompute_s + t.cp_recompute_s
    return LayerWallTimes(forward_s=forward, backward_s=backward)
