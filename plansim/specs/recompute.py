"""RecomputeOptions: activation recomputation (activation checkpointing) of a plan (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum


class Recompute(ChoiceEnum):
    """Activation recomputation: none; Megatron-LM's selective (the attention core) and full
    (whole layers), Korthikanti et al. 2022 §4-5; torchtitan's per-op selective policy
    (``SELECTIVE_OP``: ``--activation_checkpoint.mode selective`` with
    ``selective_ac_option op``), which saves the outputs of the matmuls and the attention
    kernel except every second matmul of a layer and recomputes everything else
    (``plansim.analytic.flops.op_selective_recompute_gemms``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    SELECTIVE_OP = "selective-op"


#: Megatron-Core ``--recompute-modules`` values plansim prices (besides ``core_attn``, the
#: attention core of every selective recompute).
RECOMPUTE_MODULES = ("mla_up_proj", "layernorm", "moe_act")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeOptions:
    """Which activations the backward recomputes.

    Attributes:
        recompute: the mode (:class:`Recompute`; Megatron-LM ``--recompute-granularity``).
        recompute_num_layers: with recompute full, Megatron-LM's ``--recompute-method block
            --recompute-num-layers N``: only the first N layers of every model chunk are
            recomputed (their inputs stored), the chunk's other layers keep all their
            activations; None (the default) recomputes every layer (``--recompute-method
            uniform --recompute-num-layers 1``). A chunk of at most N layers is recomputed
            whole (:meth:`recomputed_layers`).
        recompute_early_stop: with recompute full, the layers are checkpointed by torch's
            non-reentrant checkpoint with early stop (``torch.utils.checkpoint``,
            ``use_reentrant=False``, ``set_checkpoint_early_stop`` on by default; what
            ``checkpoint_wrapper``, torchtitan, llm-foundry and ``plansim validate`` use):
            the recompute stops once every tensor the backward saved is back, so a layer's
            last GEMM (the MLP down projection, whose output nobody saved) and the TP
            collective after it are not rerun. False (the default): the whole forward
            again, as Megatron-LM's and DeepSpeed's own checkpoint functions do.

        recompute_modules: with recompute selective, what Megatron-Core recomputes besides
            the attention core, comma-separated (``--recompute-modules``): ``mla_up_proj``
            (MLA's query and key/value up-projections, re-run from the stored latents),
            ``layernorm`` (the two pre-attention/pre-MLP norms, their outputs not stored),
            ``moe_act`` (the routed experts' activation function, its output not stored);
            the DeepSeek-V3 report §3.2.3 recomputes RMSNorm and the MLA up-projections.
            None: the attention core only (``core_attn``, Megatron's default). Priced in
            ``plansim.analytic.recompute_modules``.

    Raises:
        SpecError: recompute not a :class:`Recompute`, recompute_early_stop not a boolean,
            recompute_num_layers not None or a positive integer, or either set without
            recompute full; recompute_modules naming a module outside RECOMPUTE_MODULES,
            naming one twice, or set without recompute selective.
    """

    recompute: Recompute = Recompute.NONE
    recompute_num_layers: int | None = None
    recompute_early_stop: bool = False
    recompute_modules: str | None = None

    def __post_init__(self) -> None:
        if type(self.recompute) is not Recompute:
            raise choice_error("plan.recompute", self.recompute, [m.value for m in Recompute])
        if type(self.recompute_early_stop) is not bool:
            raise choice_error(
                "plan.recompute_early_stop", self.recompute_early_stop, [True, False]
            )
        if self.recompute_early_stop and self.recompute is not Recompute.FULL:
            raise SpecError(
                f"plan.recompute_early_stop needs recompute {Recompute.FULL.value} (got "
                f"{self.recompute.value}): it is how torch's checkpoint of a whole layer ends"
            )
        if self.recompute_modules is not None:
            self._check_modules()
        if self.recompute_num_layers is None:
            return
        require_positive_int("plan.recompute_num_layers", self.recompute_num_layers)
        if self.recompute is not Recompute.FULL:
            raise SpecError(
                f"plan.recompute_num_layers({self.recompute_num_layers}) needs recompute "
                f"{Recompute.FULL.value} (got {self.recompute.value}): Megatron-LM's block "
                f"method recomputes whole layers"
            )

    def _check_modules(self) -> None:
        field = "plan.recompute_modules"
        if not isinstance(self.recompute_modules, str):
            raise SpecError(
                f"{field} must be a comma-separated string, got {self.recompute_modules!r}"
            )
        names = self.modules
        unknown = [n for n in names if n not in RECOMPUTE_MODULES]
        if unknown or not names or len(set(names)) != len(names):
            raise SpecError(
                f"{field}({self.recompute_modules!r}): each of {', '.join(RECOMPUTE_MODULES)} "
                f"at most once, comma-separated"
            )
        if self.recompute is not Recompute.SELECTIVE:
            raise SpecError(
                f"{field}({self.recompute_modules!r}) needs recompute "
                f"{Recompute.SELECTIVE.value} (got {self.recompute.value})"
            )

    @property
    def modules(self) -> tuple[str, ...]:
        """The names of :attr:`recompute_modules` (empty when None)."""
        if self.recompute_modules is None:
            return ()
        return tuple(n.strip() for n in self.recompute_modules.split(",") if n.strip())

    def recomputed_layers(self, chunk_layers: int) -> int:
        """Layers of a model chunk of ``chunk_layers`` whose forward the backward re-runs in
        full: all with recompute full (``recompute_num_layers`` None), the first
        ``recompute_num_layers`` with the block method, none otherwise (selective recompute
        re-runs part of every layer: ``layer_cost``)."""
        if self.recompute is not Recompute.FULL:
            return 0
        if self.recompute_num_layers is None:
            return chunk_layers
        return min(self.recompute_num_layers, chunk_layers)

    @property
    def recompute_label(self) -> str:
        """'none', 'selective', 'full', 'full-block2' (block method, 2 layers per chunk), and
        '-early-stop' after full with :attr:`recompute_early_stop`."""
        label = self.recompute.value
        if self.recompute_modules is not None:
            label += "+" + "+".join(self.modules)
        if self.recompute_num_layers is not None:
            label += f"-block{self.recompute_num_layers}"
        return label + ("-early-stop" if self.recompute_early_stop else "")
