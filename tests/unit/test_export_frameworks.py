"""The exported configurations read by the frameworks' own parsers (optional: each test skips
where its framework is not installed; ``pip install -e ".[frameworks]"``, see the Makefile's
``install-test``).

* Megatron-LM: the ``megatron-core`` wheel has no ``megatron/training/arguments.py``, so the
  arguments are mapped onto ``TransformerConfig`` (whose fields Megatron-LM turns into
  arguments by a fixed rule, ``ArgumentGroupFactory``: the test derives every such flag name
  from the installed dataclass), ``ModelParallelConfig``, ``DistributedDataParallelConfig``
  and the micro-batch calculator, whose ``__post_init__`` / constructors run Megatron's own
  checks.
* torchtitan 0.2.x: ``ConfigManager().parse_args(["--job.config_file", path])`` (unknown keys
  are refused) and ``ParallelDims`` (the degrees must multiply to the world size).
* DeepSpeed: ``DeepSpeedConfig(dict, mpu=...)`` with a model-parallel unit that reports the
  plan's dp, so the batch triple is checked against dp; its pydantic ZeRO config refuses
  unknown keys.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.export import ExportTarget, export_plan
from plansim.export.megatron import megatron_arguments
from plansim.export.torchtitan import LLAMA3_FLAVORS
from plansim.io.runs import read_runs
from plansim.planner.backtest import predict_row
from plansim.planner.run_derive import with_derived_cells
from plansim.planner.run_model import row_model
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    DdpImpl,
    Framework,
    OffloadDevice,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
    plan_from_fields,
)


def _plan(**fields: Any) -> ParallelPlan:
    """A plan from flat field names: the one place the tests build plans."""
    return plan_from_fields(**fields)


REPO = Path(__file__).resolve().parents[2]
GPT3 = resolve_model("gpt3-175b")
LLAMA3_8B = resolve_model("llama3-8b")

DEMO = dict(
    tp=4,
    pp=8,
    dp=32,
    vpp=6,
    micro_batch_size=1,
    global_batch_size=1536,
    zero_stage=1,
    recompute=Recompute.NONE,
    sequence_parallel=True,
    schedule=Schedule.INTERLEAVED_1F1B,
    overlap_p2p_comm=True,
    overlap_grad_reduce=True,
)
FSDP2 = dict(
    tp=2,
    pp=1,
    dp=64,
    micro_batch_size=1,
    global_batch_size=512,
    zero_stage=3,
    use_torch_fsdp2=True,
    recompute=Recompute.SELECTIVE_OP,
    sequence_parallel=True,
)
ZERO3 = dict(
    tp=1,
    pp=1,
    dp=384,
    micro_batch_size=4,
    global_batch_size=1536,
    zero_stage=3,
    recompute=Recompute.FULL,
    precision=Precision.FP16,
)

# --- Megatron-LM (megatron-core) -------------------------------------------------------------

#: ``TransformerConfig`` fields that core_v0.16.1's ``_add_network_size_args`` excludes from
#: the generated arguments (``arguments.py``: "no CLI argument exists", "incompatible
#: defaults"); the exporter must not write their generated names.
_EXCLUDED = {
    "virtual_pipeline_model_parallel_size",
    "params_dtype",
    "pipeline_dtype",
    "batch_p2p_comm",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "gated_linear_unit",
    "activation_func",
    "gradient_accumulation_fusion",
    "overlap_p2p_comm",
    "attention_softmax_in_fp32",
    "masked_softmax_fusion",
    "persist_layer_norm",
    "bias_dropout_fusion",
    "apply_rope_fusion",
}
#: Arguments that core_v0.16.1's ``arguments.py`` declares itself (not generated from
#: ``TransformerConfig``), as the exporter writes them.
_OWN_FLAGS = {
    "--num-experts",  # Megatron-LM's name of num_moe_experts
    "--micro-batch-size",
    "--global-batch-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--use-distributed-optimizer",
    "--num-distributed-optimizer-instances",
    "--use-torch-fsdp2",
    "--ckpt-format",
    "--torch-fsdp2-no-reshard-after-forward",
    "--ddp-average-in-collective",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--grad-reduce-in-bf16",
    "--no-gradient-accumulation-fusion",
    "--no-overlap-p2p-communication",
    "--no-persist-layer-norm",
    "--no-scatter-gather-tensors-in-pipeline",
    "--group-query-attention",
    "--seq-length",
    "--max-position-embeddings",
    "--swiglu",
    "--squared-relu",
    "--position-embedding-type",
    "--untie-embeddings-and-output-weights",
}


def _generated_flags(config_cls: type) -> dict[str, tuple[str, Any]]:
    """{flag: (field, default)} as ``ArgumentGroupFactory`` names the fields of
    ``config_cls``: ``--field-name``; ``--no-field-name`` for booleans that default to True;
    ``argparse_meta["arg_names"]`` where a field gives them."""
    flags: dict[str, tuple[str, Any]] = {}
    for field in dataclasses.fields(config_cls):
        if field.name in _EXCLUDED or not field.init:
            continue
        default = field.default
        dashed = field.name.replace("_", "-")
        names = [f"--no-{dashed}"] if default is True else [f"--{dashed}"]
        names = field.metadata.get("argparse_meta", {}).get("arg_names", names)
        for name in names:
            flags[name] = (field.name, default)
    return flags


def _value(text: str, default: Any) -> Any:
    if isinstance(default, enum.Enum):
        return type(default)[text]
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _flag_values(arguments: tuple[str, ...]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for token in arguments:
        if token.startswith("--"):
            values[token] = None
            last = token
        else:
            values[last] = token
    return values


@dataclasses.dataclass
class _MegatronConfigs:
    model_parallel: Any
    transformer: Any
    ddp: Any
    num_microbatches: int
    args: dict[str, str | None]


def _megatron_configs(arguments: tuple[str, ...], *, dp: int) -> _MegatronConfigs:
    """Megatron-core's configs from the exported arguments, as ``core_transformer_config_
    from_args`` and ``get_megatron_ddp_config`` of Megatron-LM build them."""
    import torch
    import torch.nn.functional as F

    core = pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import TransformerConfig

    args = _flag_values(arguments)
    generated = _generated_flags(TransformerConfig)
    unknown = sorted(set(args) - set(generated) - _OWN_FLAGS)
    assert not unknown, f"not Megatron-LM {core.__version__} arguments: {unknown}"
    kwargs: dict[str, Any] = {}
    for flag, text in args.items():
        if flag in generated:
            name, default = generated[flag]
            kwargs[name] = (not default) if isinstance(default, bool) else _value(text, default)
    if "--group-query-attention" not in args:
        kwargs.pop("num_query_groups", None)
    if "--num-experts" in args:
        kwargs["num_moe_experts"] = int(args["--num-experts"] or 0)
    if "--moe-layer-freq" in args:  # Megatron-LM parses the per-layer list with eval
        kwargs["moe_layer_freq"] = ast.literal_eval(args["--moe-layer-freq"] or "1")
    if "--recompute-modules" in args:  # nargs="*": every token after the flag
        at = arguments.index("--recompute-modules") + 1
        modules = []
        while at < len(arguments) and not arguments[at].startswith("--"):
            modules.append(arguments[at])
            at += 1
        kwargs["recompute_modules"] = modules
    dtype = torch.bfloat16 if "--bf16" in args else torch.float16 if "--fp16" in args else None
    kwargs["params_dtype"] = dtype or torch.float32
    kwargs["pipeline_dtype"] = kwargs["params_dtype"]
    vpp = args.get("--num-virtual-stages-per-pipeline-rank")
    kwargs["virtual_pipeline_model_parallel_size"] = int(vpp) if vpp else None
    kwargs["overlap_p2p_comm"] = vpp is not None and "--no-overlap-p2p-communication" not in args
    for flag, name in (
        ("--decoder-first-pipeline-num-layers", "num_layers_in_first_pipeline_stage"),
        ("--decoder-last-pipeline-num-layers", "num_layers_in_last_pipeline_stage"),
    ):
        if flag in args:
            kwargs[name] = int(args[flag] or 0)
    kwargs["gradient_accumulation_fusion"] = "--no-gradient-accumulation-fusion" not in args
    kwargs["persist_layer_norm"] = "--no-persist-layer-norm" not in args
    if "--swiglu" in args:
        kwargs |= {"gated_linear_unit": True, "activation_func": F.silu}
    if "--squared-relu" in args:
        kwargs["activation_func"] = squared_relu
    mp_fields = {f.name for f in dataclasses.fields(core.ModelParallelConfig) if f.init}
    model_parallel = core.ModelParallelConfig(**{k: v for k, v in kwargs.items() if k in mp_fields})
    transformer = TransformerConfig(**kwargs)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32="--grad-reduce-in-bf16" not in args,
        overlap_grad_reduce="--overlap-grad-reduce" in args,
        overlap_param_gather="--overlap-param-gather" in args,
        use_distributed_optimizer="--use-distributed-optimizer" in args,
        num_distributed_optimizer_instances=int(
            args.get("--num-distributed-optimizer-instances") or 1
        ),
        average_in_collective="--ddp-average-in-collective" in args,
    )
    calculator = ConstantNumMicroBatchesCalculator(
        global_batch_size=int(args["--global-batch-size"] or 0),
        micro_batch_size=int(args["--micro-batch-size"] or 0),
        data_parallel_size=dp,
        decrease_batch_size_if_needed=False,
        rank=0,
    )
    return _MegatronConfigs(
        model_parallel=model_parallel,
        transformer=transformer,
        ddp=ddp,
        num_microbatches=calculator.get(),
        args=args,
    )


def test_megatron_core_accepts_the_demo_plan() -> None:
    plan = _plan(**DEMO)
    configs = _megatron_configs(megatron_arguments(plan, GPT3), dp=plan.dp)
    mp, tc = configs.model_parallel, configs.transformer
    assert (mp.tensor_model_parallel_size, mp.pipeline_model_parallel_size) == (4, 8)
    assert (mp.context_parallel_size, mp.virtual_pipeline_model_parallel_size) == (1, 6)
    assert mp.sequence_parallel is True and mp.overlap_p2p_comm is True
    assert mp.bf16 is True and mp.fp16 is False
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size) == (96, 12288, 49152)
    assert (tc.num_attention_heads, tc.num_query_groups) == (96, 96)
    assert tc.normalization == "LayerNorm" and tc.add_bias_linear is True
    assert tc.recompute_granularity is None
    assert tc.attention_backend.name == "flash"
    assert configs.ddp.use_distributed_optimizer is True
    assert configs.ddp.overlap_grad_reduce is True
    assert configs.num_microbatches == plan.num_microbatches == 48


def test_megatron_core_accepts_fsdp2_llama_with_block_recompute() -> None:
    plan = _plan(
        **FSDP2
        | dict(
            recompute=Recompute.FULL,
            recompute_num_layers=2,
            gradient_accumulation_fusion=False,
            reshard_after_forward=False,
            tp_comm_overlap=True,
        )
    )
    configs = _megatron_configs(megatron_arguments(plan, LLAMA3_8B), dp=plan.dp)
    tc = configs.transformer
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == (
        "full",
        "block",
        2,
    )
    assert tc.num_query_groups == 8 and tc.gated_linear_unit is True
    assert tc.normalization == "RMSNorm" and tc.add_bias_linear is False
    assert (tc.hidden_dropout, tc.attention_dropout) == (0.0, 0.0)
    assert tc.gradient_accumulation_fusion is False and tc.tp_comm_overlap is True
    assert configs.args["--ckpt-format"] == "torch_dist"
    assert "--untie-embeddings-and-output-weights" in configs.args
    assert configs.num_microbatches == 8


def test_megatron_core_accepts_fp8_with_bf16_layers_and_an_uneven_split() -> None:
    plan = _plan(
        tp=8,
        pp=16,
        dp=8,
        micro_batch_size=1,
        global_batch_size=128,
        zero_stage=1,
        sequence_parallel=True,
        precision=Precision.FP8,
        num_layers_at_start_in_bf16=1,
        num_layers_at_end_in_bf16=1,
        decoder_first_pipeline_num_layers=7,
        decoder_last_pipeline_num_layers=7,
        recompute=Recompute.SELECTIVE,
    )
    model = resolve_model("llama3-405b")
    tc = _megatron_configs(megatron_arguments(plan, model), dp=plan.dp).transformer
    assert (tc.fp8, tc.fp8_recipe) == ("hybrid", "tensorwise")
    assert tc.first_last_layers_bf16 is True
    assert (tc.num_layers_at_start_in_bf16, tc.num_layers_at_end_in_bf16) == (1, 1)
    assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (7, 7)
    assert tc.recompute_granularity == "selective"


def test_megatron_core_refuses_delayed_fp8_with_bf16_layers() -> None:
    """Why the export switches to current scaling: Megatron-core's own check."""
    core = pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    assert core.__version__
    with pytest.raises(ValueError, match="Delayed scaling does not support first / last layer"):
        TransformerConfig(
            num_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            fp8="hybrid",
            fp8_recipe="delayed",
            first_last_layers_bf16=True,
        )


# --- torchtitan ------------------------------------------------------------------------------


@pytest.fixture
def torchtitan_config() -> Iterator[types.ModuleType]:
    """``torchtitan.config`` of an installed torchtitan that reads TOML (0.2.x).

    ``torchtitan/__init__.py`` imports its quantization converters and through them the MoE
    Triton kernels, which need ``triton`` (absent with a CPU torch); the config package
    itself needs only tyro. Without triton the package is entered through a module object
    for its directory, skipping that ``__init__``; every ``torchtitan`` module loaded here is
    dropped afterwards.
    """
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("torchtitan is not installed")
    before = set(sys.modules)
    try:
        importlib.import_module("torchtitan")
    except ImportError:
        for name in set(sys.modules) - before:
            if name.split(".")[0] == "torchtitan":
                del sys.modules[name]
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = package
    config = importlib.import_module("torchtitan.config")
    if not hasattr(config, "JobConfig"):
        pytest.skip("this torchtitan reads no TOML job config (0.3 and later)")
    yield config
    for name in set(sys.modules) - before:
        if name.split(".")[0] == "torchtitan":
            del sys.modules[name]


def _parse_toml(config: types.ModuleType, text: str, tmp_path: Path) -> Any:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return config.ConfigManager().parse_args(["--job.config_file", str(path)])


def _parallel_dims(job: Any, plan: ParallelPlan) -> Any:
    dims = importlib.import_module("torchtitan.distributed.parallel_dims")
    par = job.parallelism
    return dims.ParallelDims(
        dp_replicate=par.data_parallel_replicate_degree,
        dp_shard=par.data_parallel_shard_degree,
        cp=par.context_parallel_degree,
        tp=par.tensor_parallel_degree,
        pp=par.pipeline_parallel_degree,
        ep=1,
        etp=1,
        world_size=plan.num_gpus,
    )


def test_torchtitan_parses_the_fsdp2_plan(
    torchtitan_config: types.ModuleType, tmp_path: Path
) -> None:
    plan = _plan(**FSDP2)
    text = export_plan(plan, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text
    job = _parse_toml(torchtitan_config, text, tmp_path)
    assert (job.model.name, job.model.flavor) == ("llama3", "8B")
    assert (job.training.local_batch_size, job.training.global_batch_size) == (1, 512)
    assert job.training.seq_len == 8192
    assert job.training.mixed_precision_param == "bfloat16"
    assert job.parallelism.data_parallel_shard_degree == 64
    assert job.parallelism.data_parallel_replicate_degree == 1
    assert job.parallelism.tensor_parallel_degree == 2
    assert job.parallelism.fsdp_reshard_after_forward == "always"
    assert job.activation_checkpoint.mode == "selective"
    assert job.activation_checkpoint.selective_ac_option == "op"
    assert job.compile.enable is True
    dims = _parallel_dims(job, plan)
    assert (dims.dp_shard, dims.tp, dims.world_size) == (64, 2, 128)
    assert dims.fsdp_enabled is True


def test_torchtitan_parses_a_pipeline_plan(
    torchtitan_config: types.ModuleType, tmp_path: Path
) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    plan = _plan(
        tp=1,
        pp=4,
        dp=16,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=128,
        zero_stage=3,
        use_torch_fsdp2=True,
        schedule=Schedule.INTERLEAVED_1F1B,
        overlap_p2p_comm=True,
        zero3_param_fetch=Zero3ParamFetch.PER_STEP,
        recompute=Recompute.FULL,
        recompute_early_stop=True,
        decoder_first_pipeline_num_layers=6,
        decoder_last_pipeline_num_layers=6,
    )
    job = _parse_toml(
        torchtitan_config, export_plan(plan, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text, tmp_path
    )
    par = job.parallelism
    assert get_schedule_class(par.pipeline_parallel_schedule).__name__ == (
        "ScheduleInterleaved1F1B"
    )
    stages = par.module_fqns_per_model_part
    assert len(stages) == 8 and [len(s) for s in stages] == [4, 5, 5, 3, 3, 5, 5, 5]
    assert [m for s in stages for m in s] == [
        "tok_embeddings",
        *(f"layers.{i}" for i in range(32)),
        "norm",
        "output",
    ]
    assert job.training.local_batch_size // par.pipeline_parallel_microbatch_size == 8
    assert (job.activation_checkpoint.mode, job.activation_checkpoint.early_stop) == (
        "full",
        True,
    )
    assert _parallel_dims(job, plan).pp == 4


def test_torchtitan_parses_a_ddp_fp8_plan(
    torchtitan_config: types.ModuleType, tmp_path: Path
) -> None:
    plan = _plan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch_size=2,
        global_batch_size=64,
        zero_stage=0,
        ddp_impl=DdpImpl.TORCH,
        overlap_grad_reduce=True,
        precision=Precision.FP8,
    )
    job = _parse_toml(
        torchtitan_config, export_plan(plan, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text, tmp_path
    )
    assert job.model.converters == ["quantize.linear.float8"]
    dims = _parallel_dims(job, plan)
    assert (dims.dp_replicate, dims.dp_shard, dims.fsdp_enabled) == (8, 1, False)


def test_torchtitan_refuses_an_unknown_key(
    torchtitan_config: types.ModuleType, tmp_path: Path
) -> None:
    text = export_plan(_plan(**FSDP2), LLAMA3_8B, to=ExportTarget.TORCHTITAN).text
    with pytest.raises(ValueError, match="Invalid field names"):
        _parse_toml(torchtitan_config, text.replace("seq_len", "sequence_length"), tmp_path)


def test_flavor_table_matches_the_installed_torchtitan(
    torchtitan_config: types.ModuleType,
) -> None:
    """:data:`LLAMA3_FLAVORS` against ``llama3_args`` in the installed torchtitan's source
    (read with ``ast``; importing it needs its data loaders), the FFN width by its
    ``FeedForward`` rule."""
    root = Path(torchtitan_config.__file__).parent.parent / "models" / "llama3"
    tree = ast.parse((root / "__init__.py").read_text())
    flavors: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "llama3_args":
            assert isinstance(node.value, ast.Dict)
            for key, call in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(key, ast.Constant) and isinstance(call, ast.Call)
                flavors[key.value] = {
                    kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg
                }
    args_source = (root / "model" / "args.py").read_text()
    assert "vocab_size: int = 128256" in args_source
    for flavor in LLAMA3_FLAVORS:
        kw = flavors[flavor.flavor]
        hidden = int(2 * 4 * kw["dim"] / 3)
        hidden = int(kw["ffn_dim_multiplier"] * hidden)
        multiple = kw["multiple_of"]
        ffn = multiple * ((hidden + multiple - 1) // multiple)
        assert (kw["n_layers"], kw["dim"], kw["n_heads"], kw["n_kv_heads"], ffn) == (
            flavor.num_layers,
            flavor.hidden_size,
            flavor.num_attention_heads,
            flavor.num_query_groups,
            flavor.ffn_hidden_size,
        )


# --- DeepSpeed -------------------------------------------------------------------------------


class _Mpu:
    """A model-parallel unit that reports the plan's data-parallel size (what Megatron's
    ``mpu`` gives ``DeepSpeedConfig``)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _deepspeed_config(text: str, dp: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    return ds_config.DeepSpeedConfig(json.loads(text), mpu=_Mpu(dp))


def test_deepspeed_accepts_the_zero3_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(**ZERO3)
    text = export_plan(plan, GPT3, to=ExportTarget.DEEPSPEED).text
    config = _deepspeed_config(text, plan.dp, monkeypatch)
    assert config.world_size == 384
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu) == (1536, 4)
    assert config.gradient_accumulation_steps == 1
    assert config.float16_config.enabled is True and config.bfloat16_config.enabled is False
    zero = config.zero_config
    assert (config.zero_optimization_stage, zero.overlap_comm) == (3, True)
    assert (zero.reduce_bucket_size, zero.prefetch_bucket_size) == (500_000_000, 50_000_000)
    assert zero.offload_optimizer is None and zero.offload_param is None
    assert config.activation_checkpointing_config.partition_activations is False


def test_deepspeed_accepts_pipeline_offload_and_autotp(monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _plan(
        tp=1,
        pp=4,
        dp=16,
        micro_batch_size=2,
        global_batch_size=256,
        zero_stage=1,
        recompute=Recompute.FULL,
        overlap_grad_reduce=True,
        grad_reduce_in_bf16=True,
    )
    text = export_plan(pipeline, GPT3, to=ExportTarget.DEEPSPEED).text
    config = _deepspeed_config(text, pipeline.dp, monkeypatch)
    assert config.gradient_accumulation_steps == 8
    assert config.pipeline["stages"] == 4 and config.pipeline["activation_checkpoint_interval"] == 1
    assert str(config.communication_data_type) == "torch.bfloat16"
    assert config.grad_accum_dtype == "bf16"
    offload = _plan(
        **ZERO3 | dict(offload_optimizer=OffloadDevice.NVME, offload_param=OffloadDevice.CPU)
    )
    config = _deepspeed_config(
        export_plan(offload, GPT3, to=ExportTarget.DEEPSPEED).text, offload.dp, monkeypatch
    )
    assert config.zero_config.offload_optimizer.device == "nvme"
    assert str(config.zero_config.offload_optimizer.nvme_path) == "/local_nvme"
    assert config.zero_config.offload_param.device == "cpu"
    autotp = _plan(tp=2, pp=1, dp=8, micro_batch_size=1, global_batch_size=16, zero_stage=2)
    config = _deepspeed_config(
        export_plan(autotp, LLAMA3_8B, to=ExportTarget.DEEPSPEED).text, autotp.dp, monkeypatch
    )
    assert config.tensor_parallel_config.autotp_size == 2
    assert config.zero_optimization_stage == 2


def test_deepspeed_refuses_a_wrong_dp_and_an_unknown_key(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(**ZERO3)
    text = export_plan(plan, GPT3, to=ExportTarget.DEEPSPEED).text
    with pytest.raises(AssertionError, match="1536 != 4 \\* 1 \\* 192"):
        _deepspeed_config(text, 192, monkeypatch)
    bad = text.replace("stage3_prefetch_bucket_size", "stage3_prefetch_bucket")
    with pytest.raises(ValueError, match="stage3_prefetch_bucket"):
        _deepspeed_config(bad, plan.dp, monkeypatch)


def _row_plan(path: str, row_id: str) -> tuple[ParallelPlan, ModelSpec]:
    """The plan the back-test chooses for a published row, and the row's model."""
    _, rows = read_runs(REPO / path)
    row = next(r for r in rows if r.text("row_id") == row_id)
    prediction = predict_row(row)
    assert prediction.plan is not None, prediction.note
    return prediction.plan, row_model(with_derived_cells(row, []), [])


def test_a_megatron_core_back_test_row_exports_to_megatron() -> None:
    plan, model = _row_plan("benchmarks/published_runs/nemo_performance.csv", "N0001")
    assert plan.framework is Framework.MEGATRON_CORE
    configs = _megatron_configs(megatron_arguments(plan, model), dp=plan.dp)
    assert configs.model_parallel.tensor_model_parallel_size == plan.tp
    assert configs.ddp.use_distributed_optimizer is (plan.zero_stage == 1)
    assert configs.num_microbatches == plan.num_microbatches
    assert configs.transformer.num_layers == model.num_layers


def test_a_torchtitan_back_test_row_exports_to_torchtitan(
    torchtitan_config: types.ModuleType, tmp_path: Path
) -> None:
    plan, model = _row_plan("benchmarks/published_runs/other_frameworks.csv", "X0009")
    assert plan.framework is Framework.TORCHTITAN and plan.use_torch_fsdp2
    job = _parse_toml(torchtitan_config, export_plan(plan, model).text, tmp_path)  # own target
    assert job.parallelism.data_parallel_shard_degree == plan.dp == 64
    assert job.activation_checkpoint.mode == "selective"
    assert _parallel_dims(job, plan).world_size == plan.num_gpus


def test_a_deepspeed_zero3_back_test_row_exports_on_todays_deepspeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan, model = _row_plan("../shared/reference/published_runs.csv", "T0011")
    assert plan.zero_stage == 3 and plan.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC
    # DeepSpeed 0.3's per-tensor fetch of 2021 is not a setting of today's DeepSpeed: refused
    with pytest.raises(SpecError, match=r"plan.zero3_param_fetch=per-tensor-sync"):
        export_plan(plan, model, to=ExportTarget.DEEPSPEED)
    today = plan.with_fields(zero3_param_fetch=Zero3ParamFetch.LAYER_PREFETCH)
    text = export_plan(today, model, to=ExportTarget.DEEPSPEED).text
    config = _deepspeed_config(text, plan.dp, monkeypatch)
    assert config.zero_optimization_stage == 3 and config.world_size == plan.dp == 384
    assert config.train_batch_size == plan.global_batch_size
    assert config.float16_config.enabled is True


def test_megatron_core_accepts_a_moe_plan_with_layout_and_recompute_modules() -> None:
    plan = _plan(
        dp=8, tp=1, pp=2, vpp=2, ep=8, etp=1, micro_batch_size=1, global_batch_size=64,
        zero_stage=1, recompute=Recompute.SELECTIVE, recompute_modules="layernorm,moe_act",
        schedule=Schedule.INTERLEAVED_1F1B, overlap_p2p_comm=True,
        pipeline_model_parallel_layout="Et*11|t*12|t*12|t*13L",
    )  # fmt: skip
    model = resolve_model("qwen3-30b-a3b")
    tc = _megatron_configs(megatron_arguments(plan, model), dp=plan.dp).transformer
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size) == (128, 8, 768)
    assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (8, 1)
    assert tc.recompute_modules == ["core_attn", "layernorm", "moe_act"]
    assert tc.kv_channels == 128 and tc.moe_grouped_gemm is True
    assert tc.moe_layer_freq == [1] * 48
