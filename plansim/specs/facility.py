"""Facility: what the data center adds to the GPUs' power, and what an hour costs (pure).

Energy of a run = (GPU energy + host power x nodes x wall time + network power x GPUs x
wall time) x PUE. PUE (power usage effectiveness) is the facility's total power over its IT
power (The Green Grid, "PUE: a comprehensive examination of the metric", 2012). None of
these has a default: a run reports GPU energy alone unless a facility is given.

Prices are the user's: dollars per GPU-hour per hardware profile name, and optionally per
kWh of facility energy (added to the GPU-hours' price, for owned clusters priced at
depreciation plus power). plansim ships no price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from plansim.errors import SpecError, require_bounded


@dataclass(frozen=True, slots=True, kw_only=True)
class Facility:
    """Power the data center draws beside the GPUs.

    Attributes:
        pue: facility power / IT power (>= 1).
        host_power_w_per_node: CPUs, memory, fans and NICs of one node, watts.
        network_power_w_per_gpu: switches of the scale-out fabric per GPU, watts.
        source: where the figures come from.

    Raises:
        SpecError: pue below 1, a negative or non-finite power.
    """

    pue: float = 1.0
    host_power_w_per_node: float = 0.0
    network_power_w_per_gpu: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        require_bounded("facility.pue", self.pue, minimum=1.0, strict=False)
        require_bounded(
            "facility.host_power_w_per_node", self.host_power_w_per_node, minimum=0, strict=False
        )
        require_bounded(
            "facility.network_power_w_per_gpu",
            self.network_power_w_per_gpu,
            minimum=0,
            strict=False,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """What compute costs.

    Attributes:
        usd_per_gpu_hour: dollars per GPU-hour, keyed by hardware profile name.
        usd_per_kwh: dollars per kWh of facility energy, or None (power included in the
            GPU-hour price).
        source: where the prices come from.

    Raises:
        SpecError: an empty table, a negative or non-finite price.
    """

    usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    usd_per_kwh: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.usd_per_gpu_hour:
            raise SpecError("prices.usd_per_gpu_hour must name at least one hardware profile")
        for name, price in self.usd_per_gpu_hour.items():
            require_bounded(f"prices.usd_per_gpu_hour.{name}", price, minimum=0, strict=False)
        if self.usd_per_kwh is not None:
            require_bounded("prices.usd_per_kwh", self.usd_per_kwh, minimum=0, strict=False)

    def gpu_hour_usd(self, profile_name: str) -> float:
        """Dollars per GPU-hour of ``profile_name``.

        Raises:
            SpecError: the table has no price for that profile (names the ones it has).
        """
        if profile_name not in self.usd_per_gpu_hour:
            known = ", ".join(sorted(self.usd_per_gpu_hour))
            raise SpecError(
                f"prices.usd_per_gpu_hour has no price for {profile_name!r}; it prices: {known}"
            )
        return float(self.usd_per_gpu_hour[profile_name])
