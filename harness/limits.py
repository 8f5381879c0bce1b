"""Measurement declarations built from a bench's limits: one place says what each suite judges
against and where the number came from. On an emulated bench run at a time scale other than 1,
every time limit is scaled the same way as the emulated latencies, and its source says so."""

from __future__ import annotations

from lumion_hil.harness import timescale
from lumion_hil.harness.config import Bench
from lumion_hil.harness.measurements import Spec


def scaled(bench: Bench, seconds: float, source: str) -> tuple[float, str]:
    """A time limit on this bench: scaled with its emulated latencies (and saying so)."""
    value, how = timescale.scaled(seconds, bench.time_scale)
    return value, f"{source}; {how}" if how else source


def received_power(bench: Bench) -> Spec:
    sens, margin = bench.limits.receiver_sensitivity_dbm, bench.limits.link_margin_db
    return Spec("received_power", "dBm", description="optical power at the receiver").at_least(
        sens.value + margin.value, f"sensitivity {sens.value:g} dBm ({sens.source}) + margin {margin.value:g} dB "
        f"({margin.source})").with_marginal(bench.limits.marginal_fraction)


def link_margin(bench: Bench) -> Spec:
    margin = bench.limits.link_margin_db
    return Spec("link_margin", "dB", description="received power above the receiver's sensitivity").at_least(
        margin.value, margin.source).with_marginal(bench.limits.marginal_fraction)


def dark_after_disconnect(bench: Bench) -> Spec:
    sens = bench.limits.receiver_sensitivity_dbm
    return Spec("power_after_disconnect", "dBm", description="a removed circuit must be dark").at_most(
        sens.value, f"below the receiver's sensitivity ({sens.source})").with_marginal(0.0)


def switch_completion(bench: Bench, connections: int) -> Spec:
    """The switch's time for some connections (scaled with the emulation) plus the allowance for
    the commands' round trips (real I/O: never scaled)."""
    per, overhead = bench.limits.switch_time_per_connection_s, bench.limits.switch_command_overhead_s
    switching, source = scaled(bench, connections * per.value, f"{connections} x {per.value:g} s ({per.source})")
    high, source = switching + overhead.value, f"{source} + {overhead.value:g} s ({overhead.source}, not scaled)"
    return Spec("switch_completion_time", "s", description=f"command to *OPC? for {connections} connection(s)").at_most(
        high, source).with_marginal(bench.limits.marginal_fraction)


def light_arrival(bench: Bench) -> Spec:
    completion = switch_completion(bench, 1)
    return Spec("light_arrival_time", "s", description="switch command to the receiver's sensitivity at the detector",
                high=completion.high, source=completion.source, marginal_fraction=bench.limits.marginal_fraction)


def link_bringup(bench: Bench) -> Spec:
    limit = bench.limits.link_up_after_light_s
    high, source = scaled(bench, limit.value, limit.source)
    return Spec("light_to_carrier_time", "s", description="light at the receiver to carrier up: transceiver lock "
                "and NIC bring-up").at_most(high, source).with_marginal(bench.limits.marginal_fraction)


def controller_overhead(bench: Bench) -> Spec:
    """The controller's own time in a recovery, in absolute seconds at every time scale: software
    runs at real time, so its budget is never scaled (harness/recovery.py measures it)."""
    limit = bench.limits.controller_overhead_s
    return Spec("controller_overhead_total", "s", software=True, description="fault to first step on the harness's clock, minus the "
                "physics the bench accounts for").at_most(limit.value, f"{limit.source} (software budget: not "
                "scaled)").with_marginal(bench.limits.marginal_fraction)


def against_prediction(name: str, bench: Bench) -> Spec:
    """A ratio the run observed over what the bench file alone predicts (harness/predictions.py):
    a gap is the regression to catch (a link slower than its rate, a spare wired in some other
    way than the prediction assumes)."""
    tolerance = bench.limits.prediction_tolerance
    return Spec(name, "ratio", description="observed / predicted from the bench file alone").in_range(
        1 - tolerance.value, 1 + tolerance.value, tolerance.source).with_marginal(bench.limits.marginal_fraction)
