"""What a power-meter channel sees: the light at the port it taps, through its tap, averaged over
its measurement window, corrected for the wavelength it was told, with noise and a dark floor.
Shared by every emulated meter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# InGaAs responsivity rises from about 0.9 A/W at 1310 nm to about 1.0 A/W at 1550 nm
# (typical datasheet curves): a meter set to the wrong wavelength misreads by about
# 0.46 dB over those 240 nm. Assumption: linear in between.
RESPONSIVITY_SLOPE_DB_PER_NM = 0.46 / 240


@dataclass
class Tap:
    port: int
    loss_db: float


class PhotodiodeChannel:
    def __init__(self, world, tap: Tap | None, *, noise_db: float, dark_floor_dbm: float, rng: random.Random,
                 wavelength_nm: float = 1550.0, offset_db: float = 0.0):
        self.world = world
        self.offset_db = offset_db  # a meter out of calibration reads every light this much higher
        self.tap = tap
        self.noise_db = noise_db
        self.dark_floor_dbm = dark_floor_dbm
        self.rng = rng
        self.wavelength_nm = wavelength_nm

    def true_dbm(self, t0_ns: int, t1_ns: int) -> float | None:
        """The power the channel receives over the window, before the meter's own errors."""
        if self.tap is None:
            return None
        mean_mw = self.world.mean_power_mw(self.tap.port, t0_ns, t1_ns)
        if mean_mw <= 0:
            return None
        return 10 * math.log10(mean_mw) - self.tap.loss_db

    def read_dbm(self, t0_ns: int, t1_ns: int) -> float:
        power = self.true_dbm(t0_ns, t1_ns)
        if power is None or power < self.dark_floor_dbm:
            return self.dark_floor_dbm + abs(self.rng.gauss(0.0, 1.0))  # noise above the floor
        assert self.tap is not None  # true_dbm has a power only through a tap
        light = self.world.wavelength_at(self.tap.port, t1_ns)
        if light is not None:
            power -= RESPONSIVITY_SLOPE_DB_PER_NM * (self.wavelength_nm - light)
        return power + self.offset_db + self.rng.gauss(0.0, self.noise_db)


def taps_for(bench, instrument: str) -> dict[int, Tap]:
    """channel -> what it taps, from the bench's detectors."""
    return {d.channel: Tap(d.port, d.tap_loss_db) for d in bench.detectors
            if d.instrument == instrument and d.channel is not None}
