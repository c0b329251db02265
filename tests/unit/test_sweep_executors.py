"""``plansim sweep`` on a real local Dask cluster and a real local Ray instance: the same
table, byte for byte, as the local process pool."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from plansim.cli import main

ARGS = ["sweep", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8,16"]
ARGS += ["--gbs", "16", "--jobs", "2"]


def _sweep(tmp_path: Path, executor: str) -> bytes:
    out = tmp_path / f"{executor}.csv"
    assert main([*ARGS, "--out", str(out), "--executor", executor]) == 0
    return out.read_bytes()


@pytest.mark.parametrize("executor", ["dask", "ray"])
def test_a_cluster_sweep_equals_the_local_one(tmp_path: Path, executor: str) -> None:
    package = "distributed" if executor == "dask" else "ray"
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (make install-test installs it)")
    local = _sweep(tmp_path, "local")
    assert _sweep(tmp_path, executor) == local
    if executor == "ray":
        import ray

        ray.shutdown()


@pytest.mark.parametrize("executor", ["dask", "ray"])
def test_a_missing_cluster_package_is_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    executor: str,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == executor else real(name, *a)
    )
    assert main([*ARGS, "--out", str(tmp_path / "t.csv"), "--executor", executor]) == 2
    err = capsys.readouterr().err
    assert f"--executor {executor} needs the '{executor}' package" in err
