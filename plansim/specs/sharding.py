"""ShardingOptions: how data-parallel ranks hold and synchronise the model states: ZeRO stage,
PyTorch FSDP, hybrid sharding (HSDP), DeepSpeed offload and parameter servers (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_flags, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum, require_members


class Zero3ParamFetch(ChoiceEnum):
    """How ZeRO-3 gathers parameters (``plansim.analytic.zero3``): one prefetched all-gather
    per layer overlapped with compute (PyTorch FSDP, Zhao et al. VLDB 2023; DeepSpeed since
    2022), one synchronous collective per parameter tensor (DeepSpeed ZeRO-3 in 2021), or one
    collective per layer waited for before the layer runs (FSDP without prefetch: e.g.
    FSDP2 on a CPU device, which has no side streams to run ahead on), or once per step
    (FSDP2 under ``torch.distributed.pipelining``, torchtitan with pp > 1: parameters and
    gradients stay unsharded across the step's micro-batches)."""

    LAYER_PREFETCH = "layer-prefetch"
    PER_TENSOR_SYNC = "per-tensor-sync"
    LAYER_SYNC = "layer-sync"
    PER_STEP = "per-step"


#: The fetch modes that gather one layer (one FSDP unit) at a time per micro-batch, where
#: FSDP's ``reshard_after_forward`` applies.
PER_LAYER_FETCH = (Zero3ParamFetch.LAYER_PREFETCH, Zero3ParamFetch.LAYER_SYNC)


class DpSync(ChoiceEnum):
    """How data-parallel ranks synchronise gradients and weights each step.

    RING: collective all-reduce (ZeRO-0) or reduce-scatter + all-gather (ZeRO-1/2) over the
    dp * cp group (NCCL rings, ``plansim.analytic.comm``). PARAMETER_SERVER: workers push
    gradients to server shards, the servers run the optimizer, workers pull the updated
    weights (Li et al. OSDI 2014; Jiang et al. OSDI 2020 "BytePS";
    ``plansim.analytic.param_server`` gives the traffic and the times).
    """

    RING = "ring"
    PARAMETER_SERVER = "parameter-server"


class OffloadDevice(ChoiceEnum):
    """Where ZeRO offload puts model states (DeepSpeed ``zero_optimization.offload_optimizer``
    / ``offload_param`` ``device``, ``OffloadDeviceEnum``): kept on the GPU, host memory
    (ZeRO-Offload, Ren et al. USENIX ATC 2021) or NVMe (ZeRO-Infinity, Rajbhandari et al.
    SC21)."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


_ENUM_FIELDS = ("offload_optimizer", "offload_param", "zero3_param_fetch", "dp_sync")
_ENUM_TYPES = (OffloadDevice, OffloadDevice, Zero3ParamFetch, DpSync)
_FLAG_FIELDS = ("use_torch_fsdp2", "reshard_after_forward")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardingOptions:
    """Model-state sharding and data-parallel synchronisation.

    Attributes:
        zero_stage: 0 (plain DP), 1 (optimizer states sharded; Megatron distributed optimizer),
            2 (+ gradients), 3 (+ parameters).
        dp_shard: hybrid sharding: the ZeRO-sharded states are sharded over dp_shard * cp
            ranks and replicated over dp / dp_shard such groups; parameters are gathered and
            gradients reduce-scattered inside a shard group, and each gradient shard is then
            all-reduced over the replicas. ZeRO-3: HSDP (PyTorch FSDP ``HYBRID_SHARD``,
            FSDP2 on a 2-D mesh, torchtitan ``data_parallel_shard_degree``); ZeRO-1/2:
            Megatron-core's partial distributed optimizer
            (``--num-distributed-optimizer-instances`` = dp / dp_shard). None (default): one
            shard group of all dp * cp ranks. Must divide dp, be below it, and give a shard
            group of at least 2 ranks; not with ZeRO-0, offload or per-tensor-sync (checked
            by the plan, which knows dp and cp: :func:`hsdp_problems`).
        offload_optimizer: DeepSpeed ``zero_optimization.offload_optimizer.device``: fp32
            master weights, Adam moments and fp32 gradients live in host memory (``cpu``) or
            on NVMe (``nvme``) and the Adam step runs on the host CPU (ZeRO-Offload, Ren et
            al. USENIX ATC 2021 §4; ZeRO-Infinity, Rajbhandari et al. SC21 §5). Needs ZeRO
            stage >= 1 (DeepSpeed: "valid with stage 1, 2, and 3"); ``nvme`` needs stage 3
            (ZeRO-Infinity: only DeepSpeed's stage-3 optimizer swaps to NVMe; its stage-1/2
            optimizer offloads when the device is ``cpu``, ``engine.zero_cpu_offload``).
            Costed in ``plansim.analytic.offload``.
        offload_param: DeepSpeed ``zero_optimization.offload_param.device``: the 16-bit
            parameter shards live in host memory or on NVMe and are fetched for every
            forward and backward. Needs ZeRO stage 3 (DeepSpeed: "valid only with stage 3").
        zero3_param_fetch: with zero_stage 3, how parameters are gathered and gradients
            reduce-scattered (:class:`Zero3ParamFetch`); ignored otherwise.
        use_torch_fsdp2: ZeRO-3 through PyTorch FSDP (FSDP1 ``FlatParameter`` or FSDP2
            ``fully_shard``; Megatron-LM ``--use-torch-fsdp2``) rather than DeepSpeed: the
            sharded parameters stay in fp32 and are the optimizer's master weights (FSDP
            ``MixedPrecision``: outside forward and backward the sharded parameters are kept
            in full precision), and the reduced gradient shard is cast back to them (fp32,
            pytorch/pytorch PR #85062), so a rank keeps 4 + 4 + 8 (Adam m, v) = 16 bytes per
            parameter / (dp * cp) where DeepSpeed's estimator counts 18 (16-bit and fp32
            copies, ../shared/reference memory.md §4.2). The 16-bit gathered layers are as
            before. Needs zero_stage 3, no DeepSpeed offload and no per-tensor-sync fetch.
        reshard_after_forward: False keeps each ZeRO-3 unit gathered from its forward to its
            backward (PyTorch FSDP2 ``fully_shard(reshard_after_forward=False)``, FSDP1
            ``SHARD_GRAD_OP``): no gather before backward, the rank's 16-bit parameters
            unsharded through the micro-batch. Needs zero_stage 3 with layer-prefetch or
            layer-sync (``plansim.analytic.zero3``).
        dp_sync: ring (default: collectives) or parameter-server: each worker pushes its
            gradients (M bytes) to server shards, the servers run Adam, each worker pulls its
            16-bit weights back (Li et al. OSDI 2014 §3.2; Jiang et al. OSDI 2020 "BytePS"
            §3.1, §4.1). Needs zero_stage 0: the servers hold the fp32 master weights and Adam
            states, which is what ZeRO shards (colocated servers already shard them like
            ZeRO-1). Times: ``plansim.analytic.param_server``.
        ps_servers: with parameter-server, 0 = colocated (BytePS with k = 0 CPU machines;
            "sharded PS"): each of the n = dp * cp ranks of a DP group also serves 1/n of
            its model shard, so a worker sends (n - 1)M/n and each server receives
            (n - 1)M/n (same volume as a ring all-reduce, one round trip of latency);
            K > 0 = K dedicated server processes for the whole job, outside the GPU nodes,
            each with one GPU's NIC bandwidth B, each holding 1/K of every parameter (Li et
            al. key ranges): a worker sends M over its NIC while each server's NIC is
            shared by the pushes of all W = num_gpus workers, so a push (and a pull) takes
            max(M/B, W M/(K B)) = M/B * max(1, W/K) (BytePS §3.1: the k < n server
            bottleneck). Must be 0 with ring.

    Raises:
        SpecError: zero_stage out of 0-3, an enum field not a member of its enum, a flag not
            a boolean, or a combination the rules above forbid (named field, allowed values).
    """

    zero_stage: int = 0
    dp_shard: int | None = None
    offload_optimizer: OffloadDevice = OffloadDevice.NONE
    offload_param: OffloadDevice = OffloadDevice.NONE
    zero3_param_fetch: Zero3ParamFetch = Zero3ParamFetch.LAYER_PREFETCH
    use_torch_fsdp2: bool = False
    reshard_after_forward: bool = True
    dp_sync: DpSync = DpSync.RING
    ps_servers: int = 0

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise choice_error("plan.zero_stage", self.zero_stage, [0, 1, 2, 3])
        require_members(
            _ENUM_FIELDS,
            (self.offload_optimizer, self.offload_param, self.zero3_param_fetch, self.dp_sync),
            _ENUM_TYPES,
        )
        require_flags(
            _FLAG_FIELDS, (self.use_torch_fsdp2, self.reshard_after_forward), prefix="plan."
        )
        if self.dp_shard is not None:
            require_positive_int("plan.dp_shard", self.dp_shard)
        _check_torch_fsdp(self)
        _check_reshard_after_forward(self)
        _check_dp_sync(self)
        _check_offload(self)


def _check_dp_sync(s: ShardingOptions) -> None:
    """dp_sync and ps_servers (see the attributes); a parameter server replaces ZeRO."""
    if isinstance(s.ps_servers, bool) or not isinstance(s.ps_servers, int):
        raise SpecError(f"plan.ps_servers must be an integer >= 0, got {s.ps_servers!r}")
    if s.ps_servers < 0:
        raise SpecError(f"plan.ps_servers must be an integer >= 0, got {s.ps_servers!r}")
    if s.dp_sync is DpSync.RING and s.ps_servers:
        raise SpecError(
            f"plan.ps_servers({s.ps_servers}) needs dp_sync "
            f"{DpSync.PARAMETER_SERVER.value} (got {s.dp_sync.value}); use 0 with ring"
        )
    if s.dp_sync is DpSync.PARAMETER_SERVER and s.zero_stage:
        raise SpecError(
            f"plan.dp_sync {DpSync.PARAMETER_SERVER.value} needs zero_stage 0 (got "
            f"{s.zero_stage}): the servers hold the fp32 master weights and optimizer "
            f"states that ZeRO would shard (colocated servers, ps_servers=0, already shard "
            f"them over the dp * cp ranks like ZeRO-1)"
        )


def _check_offload(s: ShardingOptions) -> None:
    """Offload devices against the ZeRO stage (DeepSpeed ``offload_config.py``: optimizer
    offload "valid with stage 1, 2, and 3", parameter offload "valid only with stage 3";
    NVMe swapping exists only in the stage-3 optimizer, ZeRO-Infinity)."""
    if s.offload_optimizer is s.offload_param is OffloadDevice.NONE:
        return  # allowed with every stage and fetch (the planner's common case, checked fast)
    for field in ("offload_optimizer", "offload_param"):
        device = getattr(s, field)
        allowed = offload_devices(field, s.zero_stage)
        if device.value not in allowed:
            cpu_optimizer = field == "offload_optimizer" and device is OffloadDevice.CPU
            needs = "1, 2 or 3" if cpu_optimizer else "3"
            raise SpecError(
                f"plan.{field}={device.value} needs zero_stage {needs} (got zero_stage="
                f"{s.zero_stage}); with zero_stage {s.zero_stage} choose {field} "
                f"from: {', '.join(allowed)}"
            )
    per_step = s.zero3_param_fetch is Zero3ParamFetch.PER_STEP and s.zero_stage == 3
    if per_step:
        raise SpecError(
            "plan.zero3_param_fetch=per-step (FSDP2 under torch.distributed.pipelining) "
            "needs offload_optimizer none and offload_param none (DeepSpeed's offload); "
            f"got {s.offload_optimizer.value} and {s.offload_param.value}"
        )


def _check_torch_fsdp(s: ShardingOptions) -> None:
    """PyTorch FSDP is a ZeRO-3 implementation here: stage 3, its own fetch (layer-prefetch,
    or layer-sync on a CPU device), none of DeepSpeed's offload paths."""
    if not s.use_torch_fsdp2:
        return
    problems = []
    if s.zero_stage != 3:
        problems.append(f"zero_stage 3 (got {s.zero_stage})")
    if s.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC:
        problems.append("zero3_param_fetch layer-prefetch or layer-sync (got per-tensor-sync)")
    if (s.offload_optimizer, s.offload_param) != (OffloadDevice.NONE, OffloadDevice.NONE):
        problems.append(
            "no offload (got offload_optimizer="
            f"{s.offload_optimizer.value}, offload_param={s.offload_param.value})"
        )
    if problems:
        raise SpecError(f"plan.use_torch_fsdp2 needs {'; '.join(problems)}")


def _check_reshard_after_forward(s: ShardingOptions) -> None:
    """Keeping units gathered between forward and backward (``reshard_after_forward`` False)
    is PyTorch FSDP's knob: ZeRO-3 gathering per layer (layer-prefetch or layer-sync)."""
    per_layer = s.zero3_param_fetch in PER_LAYER_FETCH
    if s.reshard_after_forward or (s.zero_stage == 3 and per_layer):
        return
    raise SpecError(
        "plan.reshard_after_forward=False needs zero_stage 3 with zero3_param_fetch "
        f"layer-prefetch or layer-sync (got zero_stage {s.zero_stage}, zero3_param_fetch "
        f"{s.zero3_param_fetch.value})"
    )


def hsdp_problems(
    *,
    dp: int,
    cp: int,
    dp_shard: int,
    zero_stage: int,
    offload: tuple[OffloadDevice, OffloadDevice],
    fetch: Zero3ParamFetch,
) -> list[str]:
    """What hybrid sharding over ``dp_shard`` of ``dp`` ranks lacks (empty: allowed): ZeRO
    1-3 over shard groups of dp_shard * cp >= 2 ranks, dp_shard a divisor of dp below it, no
    offload (DeepSpeed's ZeRO-Offload / Infinity shard over the whole group), no
    per-tensor-sync fetch. The planner asks it of its candidates (``planner.hsdp``)."""
    problems = []
    if zero_stage == 0:
        problems.append("zero_stage 1, 2 or 3 (got 0)")
    if dp % dp_shard or dp_shard >= dp:
        problems.append(
            f"a divisor of dp({dp}) below it (dp_shard = dp is full sharding: leave dp_shard unset)"
        )
    if dp_shard * cp < 2:
        problems.append(f"a shard group of at least 2 ranks (dp_shard * cp = {dp_shard * cp})")
    if offload != (OffloadDevice.NONE, OffloadDevice.NONE):
        problems.append("no offload")
    if fetch is Zero3ParamFetch.PER_TENSOR_SYNC:
        problems.append("zero3_param_fetch layer-prefetch or layer-sync (got per-tensor-sync)")
    return problems


def offload_devices(field: str, zero_stage: int) -> list[str]:
    """Devices ``field`` (``offload_optimizer`` or ``offload_param``) allows with
    ``zero_stage`` (DeepSpeed's rules, see :class:`ShardingOptions`)."""
    if zero_stage == 3:
        return [d.value for d in OffloadDevice]
    if field == "offload_optimizer" and zero_stage >= 1:
        return [OffloadDevice.NONE.value, OffloadDevice.CPU.value]
    return [OffloadDevice.NONE.value]
