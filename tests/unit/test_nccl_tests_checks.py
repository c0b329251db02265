"""nccl-tests imports that must not land: a FAILED "Out of bounds" verdict, a log of another
GPU or of more GPUs a node than the profile has; and a log of only wrong rows leads with why."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plansim.calibrate.importer import gpu_models
from plansim.calibrate.nccl_tests import parse_nccl_tests
from plansim.cli import main
from plansim.errors import InputFileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
H100_LOG = FIXTURES / "all_reduce_perf_n01_h100_1node.log"
PROFILES = Path(__file__).resolve().parents[2] / "hardware_profiles"


def _copy_profile(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    shutil.copy(PROFILES / f"{name}.yaml", path)
    return path


def test_a_failed_out_of_bounds_verdict_drops_the_table() -> None:
    text = H100_LOG.read_text().replace(
        "# Out of bounds values : 0 OK", "# Out of bounds values : 4 FAILED"
    )
    with pytest.raises(InputFileError, match="4 out-of-bounds values \\(FAILED\\)"):
        parse_nccl_tests(text, source="bad.log")
    assert parse_nccl_tests(H100_LOG.read_text(), source="ok.log").runs


def test_a_log_of_only_wrong_rows_leads_with_the_wrong_rows() -> None:
    lines = []
    for line in H100_LOG.read_text().splitlines():
        cells = line.split()
        if cells and cells[0].isdigit() and len(cells) == 13:
            cells[8] = "3"  # the out-of-place #wrong
            cells[12] = "3"  # the in-place one
            line = "  ".join(cells)
        lines.append(line)
    with pytest.raises(InputFileError) as exc:
        parse_nccl_tests("\n".join(lines), source="wrong.log")
    message = str(exc.value)
    assert message.startswith("no usable nccl-tests results: wrong.log:")
    assert "wrong elements" in message.split(";")[0] or "wrong elements" in message[:200]


def test_gpu_models_are_read_from_names() -> None:
    assert gpu_models("NVIDIA H100 80GB HBM3") == {"H100"}
    assert gpu_models("AMD Instinct MI300X") == {"MI300X"}
    assert gpu_models("cpu-2core-gloo: 2 CPU cores") == set()


def test_an_h100_log_is_refused_by_a_cpu_profile_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cpu = _copy_profile(tmp_path, "cpu-2core-gloo")
    before = cpu.read_bytes()
    assert main(["profiles", "import-nccl-tests", str(H100_LOG), "--into", str(cpu)]) == 2
    err = capsys.readouterr().err
    assert "ran 8 ranks on 1 node(s), more a node than the 2 GPUs" in err
    assert "--force" in err and cpu.read_bytes() == before
    h100 = _copy_profile(tmp_path, "h100-sxm5-80gb")
    a100 = _copy_profile(tmp_path, "a100-sxm4-80gb")
    assert main(["profiles", "import-nccl-tests", str(H100_LOG), "--into", str(a100)]) == 2
    assert "ran on NVIDIA H100 80GB HBM3; a100-sxm4-80gb describes" in capsys.readouterr().err
    argv = ["profiles", "import-nccl-tests", str(H100_LOG), "--into", str(a100), "--force"]
    assert main(argv) == 0
    assert main(["profiles", "import-nccl-tests", str(H100_LOG), "--into", str(h100)]) == 0
