"""ParallelPlan: one DP x TP x PP x CP layout with batch, ZeRO, recompute and schedule."""

from __future__ import annotations

from dataclasses import dataclass, replace

from plansim.errors import SpecError
from plansim.specs.plan_checks import (
    check_bf16_layers,
    check_dp_sync,
    check_grad_reduce_in_bf16,
    check_hsdp,
    check_offload,
    check_overlap_param_gather,
    check_recompute,
    check_reshard_after_forward,
    check_schedule,
    check_torch_fsdp,
    check_tp_comm_overlap,
    check_uneven_split,
    offload_devices,
)
from plansim.specs.plan_enums import (
    AttentionKernel,
    DdpImpl,
    DpSync,
    OffloadDevice,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
    parse_enum,
)
from plansim.specs.plan_fields import check_flags, check_sizes_and_choices
from plansim.specs.plan_label import plan_label

__all__ = [
    "AttentionKernel",
    "DdpImpl",
    "DpSync",
    "OffloadDevice",
    "ParallelPlan",
    "Precision",
    "Recompute",
    "Schedule",
    "Zero3ParamFetch",
    "offload_devices",
    "parse_enum",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelPlan:
    """A parallel layout for data (dp), tensor (tp), pipeline (pp) and context (cp) parallelism.

    Rank order is tp -> cp -> dp -> pp (Megatron-LM ``RankGenerator`` default), so a TP group
    holds consecutive ranks and stays inside a node when tp <= GPUs per node.

    Attributes:
        dp, tp, pp, cp: parallel degrees; num_gpus = dp * tp * pp * cp. Context parallelism
            (cp, Megatron-LM ``--context-parallel-size``; Llama 3, Dubey et al. 2024 §3.3.2)
            gives each of cp ranks s/cp tokens of every sequence and runs attention as a ring
            (Liu et al. 2023); weights are replicated over cp and gradients reduced over the
            dp * cp ranks (``plansim.analytic.ranks``). The micro-batch count does not depend
            on cp (the cp ranks of a replica share its sequences).
        vpp: virtual pipeline stages per rank (model chunks, Megatron
            ``virtual_pipeline_model_parallel_size``); 1 = not interleaved.
        micro_batch_size: sequences per micro-batch (``--micro-batch-size``).
        global_batch_size: sequences per optimizer step (``--global-batch-size``).
        zero_stage: 0 (plain DP), 1 (optimizer states sharded; Megatron distributed optimizer),
            2 (+ gradients), 3 (+ parameters).
        recompute: activation recomputation mode.
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
        sequence_parallel: Megatron sequence parallelism (needs tp > 1).
        schedule: pipeline schedule; interleaved-1f1b needs vpp > 1, pp > 1 and a number of
            micro-batches that is a multiple of pp (Megatron-LM's rule for interleaving);
            gpipe and 1f1b need vpp == 1; zb-h1 needs vpp == 1 and pp > 1 (any number of
            micro-batches: neither the paper nor torch's ``ScheduleInterleavedZeroBubble``
            asks for m >= pp; with m < pp fewer W fill the tail, see the builder).
        precision: matmul precision.
        attention: attention kernel (FlashAttention drops the s x s activations and traffic).
        overlap_p2p_comm: pipeline sends/receives run asynchronously beside compute (Megatron
            ``--overlap-p2p-communication``, interleaved schedule only); off, a rank waits for
            its send to finish before its next action (Megatron's default synchronous
            ``batch_isend_irecv`` + wait).
        tp_comm_overlap: Megatron-LM ``--tp-comm-overlap`` (Transformer Engine userbuffers;
            needs sequence parallelism): each TP all-gather / reduce-scatter is split into
            tp chunks pipelined with its GEMM, and the backward's input all-gather overlaps
            the input-gradient GEMM (``plansim.analytic.tp_comm``).
        overlap_grad_reduce: the ZeRO-0/1 gradient reduction of each model chunk starts in
            buckets while backward still runs (Megatron-LM ``--overlap-grad-reduce``; PyTorch
            DDP buckets, Li et al. VLDB 2020), else after the rank's last backward; ZeRO-2's
            per-micro-batch reduce-scatters run beside the next layer's backward (DeepSpeed
            ``overlap_comm``), else serially (``plansim.analytic.zero3``). No effect with
            ZeRO-3 or dp * cp == 1 (except with dedicated parameter servers: a push).
        overlap_param_gather: Megatron-LM ``--overlap-param-gather`` (distributed optimizer,
            with ``overlap_grad_reduce``): the ZeRO-1/2 parameter all-gather after the
            optimizer is issued per gradient bucket and waited for at the next step's
            forward, one bucket ahead (``plansim.analytic.rank_work``).
        grad_reduce_in_bf16: gradients accumulate and are reduced over data parallelism in
            bf16, 2 bytes per parameter, instead of Megatron's fp32 main-gradient buffer
            (Megatron-LM ``--grad-reduce-in-bf16``, ``DistributedDataParallelConfig
            (grad_reduce_in_fp32=False)``; NeMo 2's fp8 recipe ``bf16_with_fp8_mixed`` sets it,
            "NVIDIA recommends False for FP8"): halves the gradient memory and the DP
            reduce-scatter / all-reduce bytes. Needs precision bf16, fp8 or fp4 (fp16
            gradients are 16-bit already, fp32 training has no 16-bit gradients).
        gradient_accumulation_fusion: weight-gradient GEMMs accumulate straight into the
            gradient buffer (Megatron-LM ``--gradient-accumulation-fusion``, default on since
            2022); off, every micro-batch adds its fresh weight gradients into the buffer with
            a separate memory-bound pass (Megatron-LM 2021's ``main_grad.add_``, PyTorch
            autograd accumulation).
        fused_elementwise: the layer's memory-bound work runs as Megatron-LM's fused kernels
            (one per norm, RoPE, activation: ``plansim.analytic.elementwise``); off, as the
            eager PyTorch ops of Meta's reference Llama code (torchtitan 2024 without
            ``torch.compile``: RMSNorm in eight ops, RoPE on complex numbers, ``repeat_kv``
            copies, SwiGLU as silu and mul), which move more bytes and launch more kernels
            (``plansim.analytic.eager_elementwise``).
        persist_layer_norm: a layer norm's backward computes the input gradient and the
            weight (and bias) gradients in one pass over dy and x, as Megatron-LM's
            persistent layer norm does (apex ``FastLayerNormFN``; ``--no-persist-layer-norm``
            turns it off, and Megatron-LM turns it off itself before PyTorch 1.11, the
            version the kernel needs, so its 2021 runs used the other). Off, the backward is
            two passes (Megatron-LM's ``fused_mix_prec_layer_norm_cuda``, apex's
            ``FusedLayerNorm``: a weight-and-bias-gradient kernel, then the input-gradient
            kernel, each reading dy and x): 4 more bytes per element per norm
            (``plansim.analytic.elementwise``). Eager PyTorch's LayerNorm is two passes
            whatever this says (``plansim.analytic.eager_elementwise``).
        scatter_gather_p2p: without sequence parallelism, each of the tp ranks sends only
            its 1/tp slice of the b*s*h pipeline tensor and the receiving stage re-forms it
            with an all-gather over its TP group (Megatron-LM
            ``--scatter-gather-tensors-in-pipeline``, default on; Narayanan et al. SC21
            §4.1). Off, every TP rank sends the whole tensor (Megatron-LM 2020: its
            ``communicate`` sends (seq, mbs, hidden) from every rank). With sequence
            parallelism the tensor is already split over the TP ranks: no effect.
        offload_optimizer: DeepSpeed ``zero_optimization.offload_optimizer.device``: fp32
            master weights, Adam moments and fp32 gradients live in host memory (``cpu``) or
            on NVMe (``nvme``) and the Adam step runs on the host CPU (ZeRO-Offload, Ren et
            al. USENIX ATC 2021 §4; ZeRO-Infinity, Rajbhandari et al. SC21 §5). Needs ZeRO
            stage >= 1 (DeepSpeed: "valid with stage 1, 2, and 3"); ``nvme`` needs stage 3
            (ZeRO-Infinity: only DeepSpeed's stage-3 optimizer swaps to NVMe; its stage-1/2
            optimizer offloads when the device is ``cpu``, ``engine.zero_cpu_offload``).
            Costed in ``plansim.analytic.offload``; a bad combination raises SpecError
            naming the field and the devices the stage allows.
        offload_param: DeepSpeed ``zero_optimization.offload_param.device``: the 16-bit
            parameter shards live in host memory or on NVMe and are fetched for every
            forward and backward. Needs ZeRO stage 3 (DeepSpeed: "valid only with stage 3").
        dp_sync: ring (default: collectives) or parameter-server: each worker pushes its
            gradients (M bytes) to server shards, the servers run Adam, each worker pulls its
            16-bit weights back (Li et al. OSDI 2014 §3.2; Jiang et al. OSDI 2020 "BytePS"
            §3.1, §4.1). Needs zero_stage 0: the servers hold the fp32 master weights and Adam
            states, which is what ZeRO shards (colocated servers already shard them like
            ZeRO-1). Times: ``plansim.analytic.param_server``.
        ddp_impl: the data-parallel wrapper of ZeRO-0/1 gradients (:class:`DdpImpl`), which
            sets the once-per-step gradient-average passes over the rank's gradient buffer
            that the optimizer segment carries (``elementwise.grad_average_bytes``):
            Megatron-core (default) scales the buffer when dp * cp > 1, Megatron-LM's
            legacy local DDP divides it every step, PyTorch DDP copies it into its buckets
            and back. No effect with ZeRO-2/3 (their reduce-scatter path has its own) or a
            parameter server.
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
        dp_shard: hybrid sharding: the ZeRO-sharded states are sharded over dp_shard * cp
            ranks and replicated over dp / dp_shard such groups; parameters are gathered and
            gradients reduce-scattered inside a shard group, and each gradient shard is then
            all-reduced over the replicas. ZeRO-3: HSDP (PyTorch FSDP ``HYBRID_SHARD``,
            FSDP2 on a 2-D mesh, torchtitan ``data_parallel_shard_degree``); ZeRO-1/2:
            Megatron-core's partial distributed optimizer
            (``--num-distributed-optimizer-instances`` = dp / dp_shard). None (default): one
            shard group of all dp * cp ranks. Must divide dp, be below it, and give a shard
            group of at least 2 ranks; not with ZeRO-0, offload or per-tensor-sync.
        decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers: transformer
            layers on the first / last pipeline rank (Megatron-LM
            ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
            uneven pipeline split); None = an even share. The other ranks split the
            remaining layers evenly; every rank's count must divide by vpp (its model
            chunks hold equal whole layers; Megatron-LM's rule). Needs pp > 1. Llama 3 405B
            trains 126 layers on pp 16 this way, one layer fewer on the first and the last
            stage (Dubey et al. 2024, arXiv:2407.21783, §3.3.2).
        account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split: the
            input embedding (loss: output layer and loss) takes the place of one layer in the
            split (Megatron-LM ``--account-for-embedding-in-pipeline-split`` /
            ``--account-for-loss-in-pipeline-split``): L + 1 (or L + 2) slots split evenly
            over the pp * vpp stages, and the first (last) stage holds one layer fewer. With
            both, Llama 3 405B's 126 layers fill 16 ranks x 8 chunks of one slot, the first
            chunk holding only the embedding and the last only the output and loss (Dubey et
            al. 2024 §3.3.2). Needs pp > 1; not with decoder_first/last_pipeline_num_layers.
        num_layers_at_start_in_bf16, num_layers_at_end_in_bf16: with precision fp8 or fp4,
            the first / last transformer layers of the model that run in bf16 (Megatron-LM
            ``--first-last-layers-bf16`` with ``--num-layers-at-start-in-bf16`` /
            ``--num-layers-at-end-in-bf16``, Megatron-core ``is_first_last_bf16_layer``):
            their GEMMs run at the 16-bit rate without Transformer Engine's casts and keep
            16-bit GEMM inputs for the backward. Megatron-Bridge's FP8 current-scaling
            preset (``bf16_with_fp8_current_scaling_mixed``) keeps 1 and 1, its Llama 3 8B
            NVFP4 recipe 0 and 4. 0 and 0 (default): every layer quantized.

    Raises:
        SpecError: a degree is not a positive integer, the global batch does not split into
            micro-batches over dp, zero_stage is out of 0-3, sequence_parallel with tp == 1,
            vpp and the schedule do not go together (see ``schedule``), or cp > 1 without
            FlashAttention (Megatron-LM supports context parallelism only in Transformer
            Engine's attention), dp_sync not a DpSync, ps_servers not an integer >= 0 or
            > 0 with ring, parameter-server with zero_stage > 0, or bf16 layers
            (``num_layers_at_start/end_in_bf16``) not integers >= 0 or without fp8 / fp4.
    """

    dp: int
    tp: int
    pp: int
    cp: int = 1
    vpp: int = 1
    micro_batch_size: int
    global_batch_size: int
    zero_stage: int = 0
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    precision: Precision = Precision.BF16
    attention: AttentionKernel = AttentionKernel.FLASH
    overlap_p2p_comm: bool = False
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    gradient_accumulation_fusion: bool = True
    fused_elementwise: bool = True
    grad_reduce_in_bf16: bool = False
    persist_layer_norm: bool = True
    scatter_gather_p2p: bool = True
    dp_sync: DpSync = DpSync.RING
    ps_servers: int = 0
    ddp_impl: DdpImpl = DdpImpl.MEGATRON_CORE
    offload_optimizer: OffloadDevice = OffloadDevice.NONE
    offload_param: OffloadDevice = OffloadDevice.NONE
    zero3_param_fetch: Zero3ParamFetch = Zero3ParamFetch.LAYER_PREFETCH
    use_torch_fsdp2: bool = False
    reshard_after_forward: bool = True
    dp_shard: int | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    recompute_num_layers: int | None = None
    recompute_early_stop: bool = False
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0

    def __post_init__(self) -> None:
        check_sizes_and_choices(self)
        per_step = self.micro_batch_size * self.dp
        if self.global_batch_size % per_step:
            raise SpecError(
                f"plan.global_batch_size({self.global_batch_size}) is not divisible by "
                f"micro_batch_size({self.micro_batch_size}) * dp({self.dp}) = {per_step}"
            )
        check_flags(self)
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("plan.sequence_parallel needs tp > 1 (got tp=1)")
        if self.overlap_p2p_comm and not self.schedule.interleaved:
            raise SpecError(
                f"plan.overlap_p2p_comm needs schedule {Schedule.INTERLEAVED_1F1B.value} "
                f"(got {self.schedule.value}), as in Megatron-LM"
            )
        check_tp_comm_overlap(self)
        check_overlap_param_gather(self)
        check_grad_reduce_in_bf16(self)
        check_torch_fsdp(self)
        check_reshard_after_forward(self)
        check_hsdp(self)
        check_schedule(self)
        check_uneven_split(self)
        check_recompute(self)
        check_bf16_layers(self)
        check_dp_sync(self)
        check_offload(self)
        if self.cp > 1 and self.attention is not AttentionKernel.FLASH:
            raise SpecError(
                f"plan.cp({self.cp}) needs attention {AttentionKernel.FLASH.value} (got "
                f"{self.attention.value}): Megatron-LM runs context parallelism only through "
                f"Transformer Engine's fused attention (TEDotProductAttention)"
            )

    @property
    def uneven_pipeline(self) -> bool:
        """The layers do not split evenly: the first or the last pipeline rank (or stage)
        has its own layer count."""
        return (
            self.decoder_first_pipeline_num_layers is not None
            or self.decoder_last_pipeline_num_layers is not None
            or self.account_for_embedding_in_pipeline_split
            or self.account_for_loss_in_pipeline_split
        )

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

    def bf16_layer_plan(self) -> ParallelPlan:
        """The plan a layer kept in bf16 (``num_layers_at_start/end_in_bf16``) runs as: this
        one with precision bf16 and no bf16-layer counts."""
        return replace(
            self,
            precision=Precision.BF16,
            num_layers_at_start_in_bf16=0,
            num_layers_at_end_in_bf16=0,
        )

    @property
    def recompute_label(self) -> str:
        """'none', 'selective', 'full', 'full-block2' (block method, 2 layers per chunk), and
        '-early-stop' after full with :attr:`recompute_early_stop`."""
        label = self.recompute.value
        if self.recompute_num_layers is not None:
            label += f"-block{self.recompute_num_layers}"
        return label + ("-early-stop" if self.recompute_early_stop else "")

    @property
    def num_gpus(self) -> int:
        """dp * tp * pp * cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step = gradient-accumulation steps."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def num_stages(self) -> int:
        """Pipeline stages (model chunks) = pp * vpp."""
        return self.pp * self.vpp

    def label(self) -> str:
        """Compact one-line description (``plansim.specs.plan_label.plan_label``), e.g.
        'tp8 pp16 dp8 mbs1 zero1 selective sp 1f1b'."""
        return plan_label(self)
