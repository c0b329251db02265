"""ParallelDims: the parallel degrees of a plan, validated at construction (pure).

Modelled on torchtitan's ``torchtitan/distributed/parallel_dims.py`` (the degrees only, every
value in an error message) with Megatron-Core's names and rank order, and with room for
Mixture-of-Experts parallel folding (Liu et al. 2025, "MoE Parallel Folding", arXiv
2504.14960, §3): the attention layers of one pipeline stage run over tp x cp x dp ranks, the
expert layers over etp x ep x edp ranks of the same stage, so that

    tp * cp * dp == etp * ep * edp                     (one world per pipeline stage)

and a rank's expert weights are sharded over ep x etp, their gradients reduced (and ZeRO
states sharded) over edp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_positive_int

#: Rank order, fastest-varying first (Megatron-Core ``RankGenerator(order="tp-cp-ep-dp-pp")``
#: for the attention layers): a TP group holds consecutive ranks.
RANK_ORDER = ("tp", "cp", "dp", "pp")
#: Rank order of the expert layers (Megatron-Core's expert ``RankGenerator``, order
#: "tp-ep-dp-pp" over the expert degrees): an EP group holds consecutive groups of etp ranks.
EXPERT_RANK_ORDER = ("etp", "ep", "edp", "pp")
#: The integer degrees of :class:`ParallelDims` that must be positive, in check order.
DEGREE_FIELDS = ("dp", "tp", "pp", "cp", "vpp", "ep")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelDims:
    """Parallel degrees of a training job.

    Attributes:
        dp: data-parallel replicas (Megatron-LM ``--data-parallel-size`` is derived the same
            way: world size / (tp * cp * pp)).
        tp: tensor-parallel size (``--tensor-model-parallel-size``).
        pp: pipeline-parallel size (``--pipeline-model-parallel-size``).
        cp: context-parallel size (``--context-parallel-size``): each of cp ranks holds s/cp
            tokens of every sequence (ring attention, Liu et al. 2023).
        vpp: model chunks per pipeline rank (``--virtual-pipeline-model-parallel-size``;
            1 = not interleaved). Not a mesh dimension: it divides the layers, not the ranks.
        sequence_parallel: Megatron sequence parallelism (``--sequence-parallel``): the TP
            group also splits the sequence dimension of the activations outside the tensor-
            parallel GEMMs (Korthikanti et al. 2022 §4.2.2); needs tp > 1.
        ep: expert-parallel size (``--expert-model-parallel-size``): routed experts split
            over ep ranks. 1 for dense models.
        etp: expert tensor-parallel size (``--expert-tensor-parallel-size``); None (the
            default) = tp, as in Megatron-Core.
        expert_load_imbalance: routed token rows on the busiest EP rank over the mean
            (>= 1; 1.0 = balanced, as forced-balance routing and the Megatron-Bridge
            benchmarks run, "force-balance the token distribution among experts"). The
            busiest rank sets every MoE layer's expert compute and all-to-all time
            (``plansim.analytic.moe_layer``); for natural routing take it from a measured
            run (MegaBlocks, Gale et al. 2023 §3, Fig. 3, shows per-expert loads of
            dropless training far from even). Only for models with experts.

    Derived: :attr:`num_gpus` = dp * tp * pp * cp, :attr:`expert_tensor_parallel_size`,
    :attr:`edp` (expert data-parallel size) = tp * cp * dp / (etp * ep).

    Raises:
        SpecError: a degree is not a positive integer, sequence_parallel is not a boolean or
            is set with tp == 1, or ep * etp does not divide tp * cp * dp (every value in the
            message).
    """

    dp: int
    tp: int
    pp: int
    cp: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    ep: int = 1
    etp: int | None = None
    expert_load_imbalance: float = 1.0

    def __post_init__(self) -> None:
        degrees = (self.dp, self.tp, self.pp, self.cp, self.vpp, self.ep)
        if tuple(map(type, degrees)) != (int,) * 6 or min(degrees) < 1:
            for field, value in zip(DEGREE_FIELDS, degrees, strict=True):
                if type(value) is not int or value < 1:
                    require_positive_int(f"plan.{field}", value)
        if type(self.sequence_parallel) is not bool:
            raise choice_error("plan.sequence_parallel", self.sequence_parallel, [True, False])
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("plan.sequence_parallel needs tp > 1 (got tp=1)")
        imbalance = self.expert_load_imbalance
        if imbalance != 1.0 and (
            isinstance(imbalance, bool)
            or not isinstance(imbalance, int | float)
            or not math.isfinite(imbalance)
            or imbalance < 1.0
        ):
            raise SpecError(
                f"plan.expert_load_imbalance must be a finite number >= 1 (busiest EP rank's "
                f"routed rows over the mean; 1.0 = balanced), got {imbalance!r}"
            )
        if self.ep == 1 and self.etp is None:
            return  # a dense layout: the common case, checked fast
        if self.etp is not None:
            require_positive_int("plan.etp", self.etp)
        folded = self.tp * self.cp * self.dp
        experts = self.ep * self.expert_tensor_parallel_size
        if folded % experts:
            raise SpecError(
                f"plan.ep({self.ep}) * etp({self.expert_tensor_parallel_size}) = {experts} "
                f"does not divide tp({self.tp}) * cp({self.cp}) * dp({self.dp}) = {folded}: "
                f"the expert layers of a pipeline stage run on the same ranks as its "
                f"attention layers (MoE parallel folding, arXiv 2504.14960)"
            )

    @property
    def num_gpus(self) -> int:
        """dp * tp * pp * cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tensor_parallel_size(self) -> int:
        """etp, or tp when etp is None (Megatron-Core's default)."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: tp * cp * dp / (etp * ep) (parallel folding)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tensor_parallel_size)

    @property
    def mesh_dims(self) -> tuple[tuple[str, int], ...]:
        """The device mesh of the attention layers, outermost first, as torchtitan names its
        world mesh (``("pp", "dp", "cp", "tp")``, the reverse of :data:`RANK_ORDER`), with
        each size: e.g. (("pp", 8), ("dp", 32), ("cp", 1), ("tp", 4))."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        return tuple((name, sizes[name]) for name in reversed(RANK_ORDER))

    @property
    def expert_mesh_dims(self) -> tuple[tuple[str, int], ...]:
        """The device mesh of the expert layers, outermost first (("pp", ...), ("edp", ...),
        ("ep", ...), ("etp", ...)); the same ranks as :attr:`mesh_dims`."""
        sizes = {
            "etp": self.expert_tensor_parallel_size,
            "ep": self.ep,
            "edp": self.edp,
            "pp": self.pp,
        }
        return tuple((name, sizes[name]) for name in reversed(EXPERT_RANK_ORDER))
