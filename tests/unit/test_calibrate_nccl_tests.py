"""The nccl-tests parser (plansim.calibrate.nccl_tests) on logs in nccl-tests' own format.

Fixtures: tests/fixtures/nccl_tests (README there). Oracles are comm.csv rows copied here
with their ids (time us, algbw GB/s, busbw GB/s, out-of-place then in-place), and the known
alpha/busbw of the synthetic sweep.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from plansim.calibrate.fit import fit_alpha_beta
from plansim.calibrate.nccl_tests import (
    NcclTestsLog,
    NcclTestsRow,
    parse_nccl_tests,
    read_nccl_tests_log,
)
from plansim.errors import InputFileError
from plansim.specs.curves import bus_factor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
GIB = 2**30

#: comm.csv rows: size -> (oop time us, oop algbw, oop busbw, ip time us, ip algbw, ip busbw)
N01 = {
    8: (13.67, 0.0, 0.0, 13.03, 0.0, 0.0),  # C0001
    32: (68.14, 0.0, 0.0, 13.52, 0.0, 0.0),  # C0003
    16777216: (123.8, 135.55, 237.21, 123.0, 136.35, 238.61),  # C0022
    1073741824: (4029.4, 266.48, 466.33, 4016.4, 267.34, 467.85),  # C0028
    17179869184: (62648, 274.23, 479.9, 62636, 274.28, 479.99),  # C0032
}
N02_LAST = (8589934592, (47535, 180.71, 338.82, 47743, 179.92, 337.35))  # C0063
N03_FIRST = (134217728, (1211.2, 110.81, 110.81, 1211.8, 110.76, 110.76))  # C0064
N04_C0073 = (4294967296, (10505, 408.86, 357.76, 10452, 410.92, 359.56))
#: synthetic sweep: collective -> (alpha us, busbw GB/s)
SWEEP = {
    "all_reduce": (15.0, 440.0),
    "all_gather": (10.0, 360.0),
    "reduce_scatter": (12.0, 362.0),
    "sendrecv": (8.0, 180.0),
}


def _read(name: str) -> NcclTestsLog:
    return read_nccl_tests_log(FIXTURES / name)


def _check_row(row: NcclTestsRow, expected: tuple[float, ...]) -> None:
    oop, ip = row.out_of_place, row.in_place
    assert oop is not None and ip is not None
    got = (
        oop.time_s * 1e6,
        oop.algbw_bytes_per_s / 1e9,
        oop.busbw_bytes_per_s / 1e9,
        ip.time_s * 1e6,
        ip.algbw_bytes_per_s / 1e9,
        ip.busbw_bytes_per_s / 1e9,
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_n01_single_node_all_reduce_recovers_every_number() -> None:
    log = _read("all_reduce_perf_n01_h100_1node.log")
    assert log.problems == ()
    (run,) = log.runs
    assert (run.collective, run.binary, run.num_ranks, run.num_nodes) == (
        "all_reduce",
        "all_reduce_perf",
        8,
        1,
    )
    assert run.devices == ("NVIDIA H100 80GB HBM3",) and run.complete
    sizes = [r.size_bytes for r in run.rows]
    assert sizes == [2**e for e in range(3, 35)]  # 8 B .. 16 GiB
    by_size = {r.size_bytes: r for r in run.rows}
    for size, expected in N01.items():
        _check_row(by_size[size], expected)
        assert by_size[size].count == size // 4 and by_size[size].dtype == "float"
    # the fit uses the smaller time: C0003's 68.14 us out-of-place outlier is dropped
    assert by_size[32].time_s == pytest.approx(13.52e-6)


def test_n02_two_nodes_counts_ranks_and_hosts() -> None:
    (run,) = _read("all_reduce_perf_n02_h100_2nodes.log").runs
    assert (run.num_ranks, run.num_nodes, len(run.rows)) == (16, 2, 31)
    assert run.rows[0].size_bytes == 8
    size, expected = N02_LAST
    assert run.rows[-1].size_bytes == size == 8 * GIB
    _check_row(run.rows[-1], expected)


def test_table_without_preamble_takes_the_collective_from_the_file_name() -> None:
    log = _read("sendrecv_perf_n03_a100.log")
    (run,) = log.runs
    assert run.collective == "sendrecv" and run.num_ranks is None and run.num_nodes is None
    size, expected = N03_FIRST
    assert run.rows[0].size_bytes == size
    _check_row(run.rows[0], expected)  # in-place "#wrong" is N/A: still used
    assert not run.complete and log.problems == ()


def test_truncated_log_keeps_complete_rows_and_reports_the_cut_line() -> None:
    log = _read("reduce_scatter_perf_n04_h100_truncated.log")
    (run,) = log.runs
    assert run.collective == "reduce_scatter" and not run.complete
    assert [r.size_bytes for r in run.rows] == [2**e for e in range(27, 33)]
    _check_row(run.rows[-1], N04_C0073[1])
    assert run.nccl_tests_version == "2.17.6" and run.nccl_version == "2.25.1"
    (problem,) = log.problems
    assert problem.line == 24 and "incomplete row" in problem.reason
    assert problem.describe("x.log").startswith("x.log:24: incomplete row (10 of 13 columns")


def test_sweep_with_four_collectives_recovers_alpha_and_beta() -> None:
    log = _read("nccl_tests_sweep_h200_synthetic.log")
    assert [r.collective for r in log.runs] == list(SWEEP)
    assert log.problems == ()
    for run in log.runs:
        assert (run.num_ranks, run.num_nodes, run.complete) == (8, 1, True)
        assert run.nccl_version == "2.19.3"
        assert run.rows[-1].size_bytes == 8 * GIB
        alpha_us, busbw = SWEEP[run.collective]
        fit = fit_alpha_beta([r.size_bytes for r in run.rows], [r.time_s for r in run.rows])
        factor = bus_factor(run.collective, 8)
        assert fit.alpha_s * 1e6 == pytest.approx(alpha_us, rel=0.01)
        assert fit.busbw_bytes_per_s(factor) / 1e9 == pytest.approx(busbw, rel=0.01)
    gather = log.runs[1]
    assert gather.rows[0].size_bytes == 32  # 8 and 16 B rows are 0-byte rows: skipped


def test_garbage_lines_are_reported_with_line_numbers_and_skipped() -> None:
    log = _read("all_gather_perf_2nodes_srun_garbage.log")
    (run,) = log.runs
    assert (run.collective, run.num_ranks, run.num_nodes) == ("all_gather", 16, 2)
    assert [p.line for p in log.problems] == [38, 42, 45, 51]
    assert "wrong elements" in log.problems[2].reason
    assert all("NCCL INFO" not in p.text for p in log.problems)
    wrong = next(r for r in run.rows if r.size_bytes == 262144)
    assert wrong.in_place is None and wrong.out_of_place is not None
    assert len(run.rows) == 25 and run.rows[-1].size_bytes == GIB
    fit = fit_alpha_beta([r.size_bytes for r in run.rows], [r.time_s for r in run.rows])
    assert fit.alpha_s == pytest.approx(30e-6, rel=0.01)
    assert fit.busbw_bytes_per_s(bus_factor("all_gather", 16)) == pytest.approx(40e9, rel=0.01)


def test_not_nccl_tests_output_is_one_clear_error() -> None:
    with pytest.raises(InputFileError, match=r"not_nccl_tests.log: no nccl-tests results"):
        _read("not_nccl_tests.log")
    with pytest.raises(InputFileError, match="is this nccl-tests output"):
        parse_nccl_tests("", source="empty.log")
    with pytest.raises(InputFileError, match="file not found"):
        read_nccl_tests_log(FIXTURES / "missing.log")


OLD_ALL_GATHER = """\
# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#   Rank  0 Pid  12345 on     node01 device  0 [0x06] Tesla V100-SXM2-32GB
#   Rank  1 Pid  12345 on     node01 device  1 [0x07] Tesla V100-SXM2-32GB
#
#                                             out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           128   float    20.00    0.05    0.03  0e+00    21.00    0.05    0.02  0e+00
        2048           256   float    22.00    0.09    0.05  0e+00    23.00    0.09    0.04  0e+00
# Out of bounds values : 0 OK
"""


def test_old_format_without_redop_and_root_columns() -> None:
    log = parse_nccl_tests(OLD_ALL_GATHER, source="runs/all_gather_perf-2gpu.txt")
    (run,) = log.runs
    assert (run.collective, run.num_ranks, run.num_nodes) == ("all_gather", 2, 1)
    assert run.devices == ("Tesla V100-SXM2-32GB",)
    assert [r.size_bytes for r in run.rows] == [1024, 2048]
    assert run.rows[1].time_s == pytest.approx(22e-6) and run.rows[1].redop == ""


def test_prefixes_cputime_header_and_per_iteration_columns() -> None:
    text = (
        "[1,0]<stdout>:# Collective test starting: all_reduce_perf\n"
        "[1,0]<stdout>:#  size  count  type  redop  root  cputime  algbw  busbw  #wrong"
        "  i_min  i_max  i_p99  i_cv%  cputime  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%\n"
        "[1,0]<stdout>:  1048576  262144  float  sum  -1  50.00  20.97  36.70  0"
        "  49.0  52.0  51.9  1.2  40.00  26.21  45.87  0  39.0  41.0  40.9  0.9\n"
    )
    (run,) = parse_nccl_tests(text, source="mpi.out").runs
    (row,) = run.rows
    assert row.out_of_place is not None and row.in_place is not None
    assert (row.out_of_place.time_s, row.in_place.time_s) == pytest.approx((50e-6, 40e-6))
    assert row.in_place.busbw_bytes_per_s == pytest.approx(45.87e9)


HEADER = (
    "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong\n"
)


def test_unsupported_and_unnamed_collectives() -> None:
    header = HEADER
    row = "  1024  256  float  sum  -1  10.0  0.10  0.10  0  10.0  0.10  0.10  0\n"
    broadcast = "# Collective test starting: broadcast_perf\n" + header + row
    reduce = "# Collective test starting: all_reduce_perf\n" + header + row
    log = parse_nccl_tests(broadcast + reduce, source="both.log")
    assert [r.collective for r in log.runs] == ["all_reduce"]
    (problem,) = log.problems
    assert problem.line == 3 and "broadcast_perf results are not used" in problem.reason
    assert "all_to_all" in problem.reason  # the message lists what is modelled
    with pytest.raises(InputFileError, match="cannot tell which collective"):
        parse_nccl_tests(header + row, source="unnamed.log")
    forced = parse_nccl_tests(header + row, source="unnamed.log", collective="sendrecv")
    assert forced.runs[0].collective == "sendrecv"


#: synthetic alltoall fixture: alpha us, busbw GB/s (bandwidth term), ranks
ALLTOALL = (25.0, 340.0, 8)


def test_alltoall_log_is_all_to_all_over_the_whole_send_buffer() -> None:
    log = _read("alltoall_perf_h200_synthetic.log")
    assert log.problems == ()
    (run,) = log.runs
    assert (run.collective, run.binary, run.num_ranks, run.num_nodes) == (
        "all_to_all",
        "alltoall_perf",
        8,
        1,
    )
    assert run.complete and run.devices == ("NVIDIA H200",) and run.nccl_version == "2.19.3"
    # 8 and 16 B are below one element per peer: 0-byte rows, skipped
    assert [r.size_bytes for r in run.rows] == [2**e for e in range(5, 31)]
    last = run.rows[-1]
    assert last.count == last.size_bytes // 4 // 8  # nccl-tests' count: elements per peer
    assert last.redop == "none" and last.in_place is not None  # in-place #wrong is N/A
    assert last.out_of_place is not None
    oop = last.out_of_place
    assert (oop.time_s, oop.algbw_bytes_per_s, oop.busbw_bytes_per_s) == pytest.approx(
        (2788.31e-6, 385.09e9, 336.95e9)
    )
    assert oop.busbw_bytes_per_s / oop.algbw_bytes_per_s == pytest.approx(7 / 8, rel=1e-4)
    alpha_us, busbw, ranks = ALLTOALL
    fit = fit_alpha_beta([r.size_bytes for r in run.rows], [r.time_s for r in run.rows])
    assert fit.alpha_s * 1e6 == pytest.approx(alpha_us, rel=0.01)
    assert fit.busbw_bytes_per_s(bus_factor("all_to_all", ranks)) / 1e9 == pytest.approx(
        busbw, rel=0.01
    )


def test_alltoall_ranks_from_the_bus_factor_and_forced_collective() -> None:
    # alltoall over 16 ranks: busbw = algbw * 15/16
    row = "  33554432  524288  float  none  -1  181.2  185.21  173.63  0"
    row += "  180.9  185.48  173.89  N/A\n"
    (run,) = parse_nccl_tests(HEADER + row, source="logs/alltoall_perf.log").runs
    assert (run.collective, run.binary, run.num_ranks) == ("all_to_all", "alltoall_perf", 16)
    forced = parse_nccl_tests(HEADER + row, source="unnamed.log", collective="all_to_all")
    assert forced.runs[0].collective == "all_to_all" and forced.runs[0].num_ranks == 16
    with pytest.raises(InputFileError, match=r"collective 'alltoall' is not supported.*all_to_all"):
        parse_nccl_tests(HEADER + row, source="unnamed.log", collective="alltoall")


def test_rank_count_is_inferred_from_the_bus_factor_without_rank_lines() -> None:
    # all_reduce over 8 ranks: busbw = algbw * 2 * 7 / 8 = 1.75 algbw
    row = "  1073741824  268435456  float  sum  -1  4016.4  267.34  467.85  0"
    row += "  4016.4  267.34  467.85  0\n"
    (run,) = parse_nccl_tests(HEADER + row, source="all_reduce_perf.log").runs
    assert run.num_ranks == 8 and run.num_nodes is None


def test_to_frame_is_tidy_in_si_units() -> None:
    table = _read("reduce_scatter_perf_n04_h100_truncated.log").to_frame()
    assert len(table) == 6 and set(table["collective"]) == {"reduce_scatter"}
    last = table.iloc[-1]
    assert last["oop_time_s"] == pytest.approx(10505e-6)
    assert last["ip_busbw_bytes_per_s"] == pytest.approx(359.56e9)
    assert not math.isnan(last["ip_time_s"])
