"""Property-based fuzzing of plansim's readers and command line (Hypothesis): whatever the
input, a reader returns its object or raises one PlansimError naming the field, and the CLI
answers with status 0, 1 or 2 in bounded time; never a traceback, never a hang."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from plansim.cli import main  # noqa: E402
from plansim.errors import PlansimError  # noqa: E402
from plansim.io.hf_config import read_hf_config  # noqa: E402
from plansim.io.profile_parse import profile_from_dict  # noqa: E402
from plansim.io.profiles import profiles_dir  # noqa: E402
from plansim.io.run_files import read_facility, read_failures, read_prices, read_ramp  # noqa: E402

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples every run: a red CI is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: Values a hostile or broken file may hold where a number is due.
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
PROFILE = yaml.safe_load((profiles_dir() / "h100-sxm5-80gb.yaml").read_text())
NUMBER_KEYS = sorted(k for k, v in PROFILE.items() if isinstance(v, int | float))
HF = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama3_8b.json").read_text()
)


@FUZZ
@given(key=st.sampled_from(NUMBER_KEYS), value=VALUES)
def test_a_profile_number_is_read_or_refused_naming_its_key(key: str, value: Any) -> None:
    data = copy.deepcopy(PROFILE)
    data[key] = value
    try:
        profile_from_dict(data, source="fuzz.yaml")
    except PlansimError as exc:
        assert key in str(exc), str(exc)


@FUZZ
@given(key=st.sampled_from(sorted(HF)), value=VALUES)
def test_an_hf_config_value_is_read_or_refused(tmp_path: Path, key: str, value: Any) -> None:
    data = dict(HF)
    data[key] = value
    path = tmp_path / "config.json"
    try:
        path.write_text(json.dumps(data))
    except ValueError:  # a value JSON cannot hold (NaN is written; huge ints are fine)
        return
    try:
        read_hf_config(path)
    except PlansimError as exc:
        assert str(exc)


RUN_FILES = {
    "failures": (
        read_failures,
        {"interruptions_per_gpu_hour": 1e-5, "restart_min": 10, "checkpoint_write_gb_per_s": 100},
    ),
    "facility": (
        read_facility,
        {"pue": 1.2, "host_power_w_per_node": 1000, "network_power_w_per_gpu": 20},
    ),
    "prices": (read_prices, {"usd_per_gpu_hour": {"h100-sxm5-80gb": 2.0}}),
}


@FUZZ
@given(kind=st.sampled_from(sorted(RUN_FILES)), key=st.text(max_size=30), value=VALUES)
def test_a_run_file_is_read_or_refused_naming_the_file(
    tmp_path: Path, kind: str, key: str, value: Any
) -> None:
    reader, good = RUN_FILES[kind]
    data = dict(good)
    data[key if key.strip() else next(iter(good))] = value
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        reader(path)
    except PlansimError as exc:
        assert str(path) in str(exc)


@FUZZ
@given(
    gbs=st.one_of(st.integers(min_value=-5, max_value=5000), VALUES),
    until=st.one_of(st.floats(min_value=-1e12, max_value=2e12), VALUES),
)
def test_a_ramp_file_is_read_or_refused_naming_the_file(
    tmp_path: Path, gbs: Any, until: Any
) -> None:
    data = {"phases": [{"until_tokens": until, "global_batch_size": gbs}, {"global_batch_size": 8}]}
    path = tmp_path / "ramp.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        read_ramp(path, tokens=1e12, seq_length=2048)
    except PlansimError as exc:
        assert str(path) in str(exc)


_COUNTS = st.one_of(
    st.integers(min_value=-3, max_value=64),
    st.sampled_from(["0", "1e3", "nan", "-1", "10000000000000000000000", "x", "8:4"]),
)


@FUZZ
@given(gpus=_COUNTS, tp=_COUNTS, pp=_COUNTS, mbs=_COUNTS, gbs=_COUNTS, tokens=VALUES)
def test_simulate_answers_0_1_or_2_for_any_layout_numbers(
    capsys: pytest.CaptureFixture[str],
    gpus: Any,
    tp: Any,
    pp: Any,
    mbs: Any,
    gbs: Any,
    tokens: Any,
) -> None:
    argv = ["simulate", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb"]
    argv += ["--gpus", str(gpus), "--tp", str(tp), "--pp", str(pp), "--mbs", str(mbs)]
    argv += ["--gbs", str(gbs), "--tokens", str(tokens)]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    assert status in (0, 1, 2)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if status == 2:
        assert err.startswith("plansim: error:") or "usage:" in err
