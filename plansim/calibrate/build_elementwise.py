"""Raw calibration rows -> the measured rate of a layer's memory-bound kernels. Pure (pandas).

The ``elementwise`` items (``plansim.calibrate.bench_elementwise``) run the non-GEMM kernels
of a GELU transformer layer in eager torch, forward (``layer_fwd``) and forward + backward
(``layer_fwd_bwd``), for ``tokens x hidden`` shapes (FFN 4h). Each is credited with the bytes
``plansim.analytic.elementwise.gelu_layer_bytes`` counts for that layer (``work``), so the
rate applies to the simulator's count as it is: forward rate = forward bytes / forward time;
backward rate = backward bytes / (forward + backward time - forward time). The profile gets
the median over shapes (``elementwise_forward_gb_per_s``, ``elementwise_backward_gb_per_s``).
"""

from __future__ import annotations

import statistics

import pandas as pd

from plansim.calibrate.build_terms import Terms


def _by_shape(rows: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """shape -> (work, time_s) of ``rows`` (one aggregated row per shape)."""
    return {
        str(shape): (float(work), float(time_s))
        for shape, work, time_s in zip(rows["shape"], rows["work"], rows["time_s"], strict=True)
    }


def elementwise_term(table: pd.DataFrame, *, source: str, streaming_bytes_per_s: float) -> Terms:
    """The two elementwise rates from the aggregated ``table``, or no term when the rows are
    missing (runs recorded before the items existed) or no shape has a positive backward.

    Args:
        table: :func:`plansim.calibrate.aggregate.aggregate` rows.
        source: provenance prefix.
        streaming_bytes_per_s: the run's streaming rate, for the summary's comparison.
    """
    rows = table[table["kind"] == "elementwise"]
    fwd = _by_shape(rows[rows["op"] == "layer_fwd"])
    both = _by_shape(rows[rows["op"] == "layer_fwd_bwd"])
    forward, backward, shapes = [], [], []
    for shape in sorted(set(fwd) & set(both), key=lambda s: fwd[s][0]):
        (w_fwd, t_fwd), (w_both, t_both) = fwd[shape], both[shape]
        if t_fwd <= 0 or t_both <= t_fwd:
            continue
        forward.append(w_fwd / t_fwd)
        backward.append((w_both - w_fwd) / (t_both - t_fwd))
        shapes.append(str(shape))
    if not shapes:
        return Terms()
    fwd_rate, bwd_rate = statistics.median(forward), statistics.median(backward)
    dtype = str(rows["dtype"].iloc[0])
    text = (
        f"{source}; non-GEMM kernels of a GELU layer in eager torch ({dtype}: 2 layer_norm, "
        f"2 residual add, GELU; backward by autograd) at tokens x hidden {', '.join(shapes)} "
        "(FFN 4h), credited with the bytes plansim.analytic.elementwise counts for the layer "
        f"(22h + 4f per token forward, 38h + 8f backward, 16-bit); median over shapes of "
        "bytes / seconds (backward: forward+backward less forward); ranks concurrent, median "
        "over ranks"
    )
    stream = f" (streaming {streaming_bytes_per_s / 1e9:.4g})" if streaming_bytes_per_s else ""
    return Terms(
        scalars={
            "elementwise_forward_bytes_per_s": fwd_rate,
            "elementwise_backward_bytes_per_s": bwd_rate,
        },
        provenance={
            "elementwise_forward_gb_per_s": text,
            "elementwise_backward_gb_per_s": text,
        },
        summary=[
            (
                "layer elementwise",
                f"forward {fwd_rate / 1e9:.4g}, backward {bwd_rate / 1e9:.4g} GB/s{stream}",
            )
        ],
    )
