"""Helpers the suites share for reading light the way a receiver would see it."""

from __future__ import annotations

from lumion_hil.harness.config_topology import Detector


def received_dbm(session, detector: Detector):
    """Power at the receiver fed by the detector's port: the port's power less the receive
    fibre. An out-of-range reading is passed on as it is (never as a number)."""
    return session.received_dbm(detector)


def light_threshold_reading_dbm(bench_file, detector: Detector) -> float:
    """The meter reading at which the receiver behind the port reaches its sensitivity."""
    nic = bench_file.nic_on_rx_port(detector.port)
    rx_loss = nic[1].rx_fibre_loss_db if nic else 0.0
    return bench_file.limits.receiver_sensitivity_dbm.value + rx_loss - detector.tap_loss_db


def trace_interval_s(budget_s: float) -> float:
    """The sample interval of a trace that should catch light within ``budget_s``: a thousandth
    of it, and no shorter than 100 us (the emulated N77xx's shortest averaging time, the bench's
    min_sample_interval_s by default). A coarser trace (a 200th) placed the arrival only to
    within 0.8 ms at a fifth of real time, 5% of a 16 ms arrival: the sampling, not the light,
    set the figure."""
    return max(1e-4, budget_s / 1000)
