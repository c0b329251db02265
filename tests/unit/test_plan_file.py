"""Plan files: YAML round trip of planner plans, schema errors that name the key, and the
commands that write and read them (plan --save-plan, simulate --plan, validate --plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from plansim.cli import build_parser, main
from plansim.commands.validate import apply_plan_file
from plansim.errors import InputFileError, SpecError
from plansim.io.plan_file import (
    PlanFile,
    load_plan_text,
    plan_file_text,
    plan_from_dict,
    plan_to_dict,
    read_plan_file,
    write_plan_file,
)
from plansim.report.tables import plan_dict
from plansim.specs.plan import Framework, Precision, Schedule, plan_from_fields
from tests.unit.test_plan_vocabulary import DEMO, _sample_plans

SIMULATE_FLAGS = [
    "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "64", "--gbs", "64",
    "--tp", "8", "--pp", "4", "--vpp", "2", "--mbs", "1", "--zero", "1",
    "--sequence-parallel", "--schedule", "interleaved-1f1b", "--overlap-p2p-comm",
    "--overlap-grad-reduce", "--recompute", "full", "--recompute-num-layers", "2",
]  # fmt: skip


def test_a_thousand_planner_plans_round_trip_through_yaml() -> None:
    for plan in _sample_plans(1000, seed=0):
        text = yaml.safe_dump(plan_to_dict(plan), sort_keys=False)
        assert plan_from_dict(load_plan_text(text)) == plan


def test_a_plan_file_reads_back_to_the_same_file(tmp_path: Path) -> None:
    plan = plan_from_fields(**DEMO)
    written = PlanFile(
        plan=plan,
        model="gpt3-175b",
        gpu="a100-sxm4-80gb",
        num_gpus=1024,
        prediction={"step_time_s": 16.897},
    )
    path = write_plan_file(tmp_path / "best.yaml", written)
    read = read_plan_file(path)
    assert read == written
    assert plan_file_text(read) == path.read_text()
    doc = yaml.safe_load(path.read_text())
    assert doc["plan"]["pipeline"]["schedule"] == "interleaved-1f1b"  # enums as their values
    assert doc["plan"]["dims"] == {
        "dp": 32, "tp": 4, "pp": 8, "cp": 1, "vpp": 6, "sequence_parallel": True, "ep": 1,
        "etp": None, "expert_load_imbalance": 1.0,
    }  # fmt: skip


def _file(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _good() -> dict[str, object]:
    return yaml.safe_load(
        plan_file_text(
            PlanFile(plan=plan_from_fields(**DEMO), model="gpt3-175b", gpu="h100", num_gpus=1024)
        )
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["plan"].update(tensor={}),
            "plan.tensor is not a plan group; choose from: dims",
        ),
        (
            lambda d: d["plan"]["dims"].update(tensor_parallel=8),
            "plan.dims.tensor_parallel is not a field of dims; choose from: dp, tp, pp",
        ),
        (
            lambda d: d["plan"]["pipeline"].update(schedule="1F1B"),
            "plan.pipeline.schedule='1F1B' is not allowed; choose one of: gpipe, 1f1b",
        ),
        (
            lambda d: d["plan"]["sharding"].update(zero_stage=5),
            "plan.zero_stage=5 is not allowed; choose one of: 0, 1, 2, 3",
        ),
        (lambda d: d.update(num_gpus=512), "num_gpus(512) != the plan's tp(4) * pp(8)"),
        (lambda d: d.update(plansim_plan=2), "plansim_plan=2 is not allowed; choose one of: 1"),
        (lambda d: d.pop("gpu"), "missing key(s): gpu"),
        (lambda d: d.update(tp=4), "'tp' is not a plan-file key; choose from: plansim_plan"),
        (lambda d: d["plan"].pop("batch"), "plan.batch is required"),
    ],
)
def test_plan_file_errors_name_the_key(tmp_path: Path, edit: object, message: str) -> None:
    doc = _good()
    edit(doc)  # type: ignore[operator]
    path = _file(tmp_path, doc)
    with pytest.raises(InputFileError) as info:
        read_plan_file(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_a_file_that_is_not_yaml_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="not YAML"):
        read_plan_file(_file(tmp_path, "plan: [unclosed"))
    with pytest.raises(InputFileError, match="cannot read"):
        read_plan_file(tmp_path / "missing.yaml")


def test_simulate_plan_equals_simulate_with_the_same_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *SIMULATE_FLAGS, "--format", "json"]) == 0
    by_flags = capsys.readouterr().out
    args = build_parser().parse_args(["simulate", *SIMULATE_FLAGS])
    from plansim.commands.simulate import plan_from_args

    plan = plan_from_args(args)
    assert plan.recompute_num_layers == 2 and plan.schedule is Schedule.INTERLEAVED_1F1B
    path = write_plan_file(
        tmp_path / "p.yaml",
        PlanFile(plan=plan, model="gpt3-175b", gpu="a100-sxm4-80gb", num_gpus=64),
    )
    assert main(["simulate", "--plan", str(path), "--format", "json"]) == 0
    assert capsys.readouterr().out == by_flags


def test_plan_saves_the_ranked_plan_that_simulate_reproduces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    query += ["--gbs", "16", "--top", "3", "--jobs", "1", "--format", "json"]
    path = tmp_path / "second.yaml"
    assert main([*query, "--save-plan", str(path), "--rank", "2"]) == 0
    ranked = json.loads(capsys.readouterr().out)["plans"]
    saved = read_plan_file(path)
    assert plan_dict(saved.plan) == ranked[1]["plan"]
    assert plan_dict(saved.plan) != ranked[0]["plan"]
    assert saved.prediction is not None
    assert saved.prediction["step_time_s"] == pytest.approx(ranked[1]["step_time_s"], abs=1e-6)
    assert main(["simulate", "--plan", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(
        ranked[1]["step_time_s"], rel=1e-12
    )
    assert main([*query, "--save-plan", str(path), "--rank", "4"]) == 2
    assert "--rank 4: the search ranked 3 plan(s)" in capsys.readouterr().err


def test_plan_flags_do_not_go_with_a_plan_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_plan_file(
        tmp_path / "p.yaml",
        PlanFile(
            plan=plan_from_fields(**DEMO), model="gpt3-175b", gpu="a100-sxm4-80gb", num_gpus=1024
        ),
    )
    assert main(["simulate", "--plan", str(path), "--tp", "8"]) == 2
    assert "--tp is given with --plan" in capsys.readouterr().err
    assert main(["simulate", "--plan", str(path), "--no-persist-layer-norm"]) == 2
    assert "--no-persist-layer-norm is given with --plan" in capsys.readouterr().err
    assert main(["simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb"]) == 2
    err = capsys.readouterr().err
    assert "required: --gpus, --gbs, --tp, --pp, --mbs (or --plan)" in err


def test_validate_takes_the_layout_of_a_plan_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = {"dp": 1, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4}
    planned = plan_from_fields(**fields, precision=Precision.FP32)
    path = write_plan_file(
        tmp_path / "p.yaml",
        PlanFile(plan=planned, model="llama3-8b", gpu="cpu-2core-gloo", num_gpus=2),
    )
    parser = build_parser()
    args = parser.parse_args(
        ["validate", "--plan", str(path), "--backend", "gloo", "--out", str(tmp_path / "o"),
         "--num-layers", "2", "--hidden-size", "64"]
    )  # fmt: skip
    plan = apply_plan_file(args)
    assert plan == planned
    got = (args.model, args.dtype, args.nproc, args.profile)
    assert got == ("llama3-8b", "fp32", 2, "cpu-2core-gloo")
    assert capsys.readouterr().err == ""  # every planned field is one the validator runs
    flags = parser.parse_args(
        ["validate", "--model", "llama3-8b", "--tp", "1", "--pp", "2", "--mbs", "1", "--gbs",
         "4", "--nproc", "2", "--profile", "cpu-2core-gloo", "--backend", "gloo", "--out", "o"]
    )  # fmt: skip
    assert apply_plan_file(flags) is None
    from plansim.commands.validate import plan_from_args

    assert plan_from_args(flags) == plan
    overlapped = planned.with_fields(overlap_grad_reduce=True)
    path = write_plan_file(
        tmp_path / "o.yaml",
        PlanFile(plan=overlapped, model="llama3-8b", gpu="cpu-2core-gloo", num_gpus=2),
    )
    args = parser.parse_args(["validate", "--plan", str(path), "--backend", "gloo", "--out", "o"])
    assert apply_plan_file(args) == planned
    assert "runs these planned fields as torch does" in capsys.readouterr().err
    with pytest.raises(SpecError, match="--tp is given with --plan"):
        apply_plan_file(parser.parse_args([*args_list(path), "--tp", "2"]))


def args_list(path: Path) -> list[str]:
    return ["validate", "--plan", str(path), "--backend", "gloo", "--out", "o"]


def test_export_writes_the_plan_files_framework_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_from_fields(**DEMO)
    path = write_plan_file(
        tmp_path / "best.yaml",
        PlanFile(plan=plan, model="gpt3-175b", gpu="a100-sxm4-80gb", num_gpus=1024),
    )
    assert main(["export", str(path)]) == 0  # megatron-core plan: Megatron-LM arguments
    text = capsys.readouterr().out
    assert "--tensor-model-parallel-size 4\n" in text and "--use-distributed-optimizer\n" in text
    out = tmp_path / "ds.json"
    assert main(["export", str(path), "--to", "deepspeed", "--out", str(out)]) == 2
    assert "cannot export the plan to DeepSpeed" in capsys.readouterr().err
    assert not out.exists()  # nothing half-written on a refusal
    assert main(["export", str(path), "--to", "megatron", "--out", str(out)]) == 0
    assert out.read_text() == text
    composer = plan.with_fields(framework=Framework.COMPOSER)
    path = write_plan_file(
        tmp_path / "c.yaml",
        PlanFile(plan=composer, model="gpt3-175b", gpu="a100-sxm4-80gb", num_gpus=1024),
    )
    assert main(["export", str(path)]) == 2
    assert "plan.framework composer has no export target" in capsys.readouterr().err
