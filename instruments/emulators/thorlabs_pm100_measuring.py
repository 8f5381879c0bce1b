"""How the emulated Thorlabs PM100D measures (:class:`PM100Measuring`): its one gain stage
(ranges chosen as a current or a power, auto ranging, settling after a change), its corrections
(the photodiode's responsivity, the zero), and the SCPI measurement system (CONFigure, INITiate,
FETCh?, READ?, MEASure?): a reading integrated over the averaging window from the world's
history, frequency counted at the peak detector's threshold, the head's temperature, and each
formatted as the console answers it."""

from __future__ import annotations

import math
import time
from typing import Any

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel
from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    DATA_STALE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    ScpiError,
    keyword,
    no_args,
    parse_number,
)
from lumion_hil.instruments.emulators.thorlabs_pm100_tables import (
    CURRENT_RANGES_A,
    FILTERED_BANDWIDTH_HZ,
    FREQUENCY_GATE_S,
    FREQUENCY_RANGE_HZ,
    FREQUENCY_SAMPLES,
    HEAD_TEMPERATURE_C,
    NTC_BETA_K,
    NTC_R0_OHM,
    OVER_RANGE,
    POWER_RANGES_W,
    RANGE_SETTLE_S,
    RANGING,
    SAMPLE_S,
    WAVELENGTH,
    nr3,
)


class PM100Measuring(ScpiDevice):
    """The gain stage, the corrections and the measurement system of the emulated PM100D."""

    # What measuring reads: the world and the sensor's head, and the settings the console holds
    # (power-on and *RST set them: ThorlabsPM100Emulator._defaults).
    world: Any
    head: PhotodiodeChannel
    unit: str
    averaging: int
    auto_range: bool
    gain: int  # the range in use: an index into CURRENT_RANGES_A and POWER_RANGES_W
    wavelength_nm: float
    input_loss_db: float
    beam_mm: float
    reference_w: float
    relative: bool
    reference_a: float
    relative_current: bool
    filter: bool
    zero_a: float
    threshold_pct: int
    configured: str
    continuous: bool
    last: tuple[str, float] | None
    settled_at_ns: int

    # -- ranges ---------------------------------------------------------------------------------

    @staticmethod
    def _fit(table: tuple[float, ...], value: float) -> int:
        """The most sensitive range that holds ``value`` (the least sensitive for more)."""
        for index, top in enumerate(table):
            if value <= top * (1 + 1e-9):
                return index
        return len(table) - 1

    def _range_index(self, args: str, table: tuple[float, ...], unit: str, *, query: bool) -> int | None:
        text = args.strip()
        if not text:
            if query:
                return None
            raise ScpiError(*MISSING_PARAMETER)
        word = keyword(text)
        if word == "MIN":
            return 0
        if word == "MAX":
            return len(table) - 1
        if word == "DEF":
            raise ScpiError(*ILLEGAL_PARAMETER)  # the reference lists MIN and MAX only
        step = text.upper()
        if step in ("UP", "DOWN"):  # the next less or more sensitive gain, where there is one (PM100D2 reference)
            if query:
                raise ScpiError(*ILLEGAL_PARAMETER)  # the query takes a value, MIN, MAX or AUTO
            return min(self.gain + 1, len(table) - 1) if step == "UP" else max(self.gain - 1, 0)
        value = parse_number(text, unit)
        if value < 0:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return self._fit(table, value)

    def _set_range(self, args: str, table: tuple[float, ...], unit: str) -> None:
        index = self._range_index(args, table, unit, query=False)
        assert index is not None  # None only for a query without an argument
        self.gain = index
        self.auto_range = False  # choosing a range ends auto ranging, as on the meter
        self.settled_at_ns = self.world.now_ns() + self.world.scaled_ns(RANGE_SETTLE_S)
        self.set_condition("OPERation", RANGING, True)

    def _settle(self) -> None:
        """Measuring waits while the gain stage settles after a range change; then the ranging
        condition ends."""
        wait_ns = self.settled_at_ns - self.world.now_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        self.set_condition("OPERation", RANGING, False)

    def handle_line(self, line: str):
        if self.status["OPERation"]["CONDition"] & RANGING and self.world.now_ns() >= self.settled_at_ns:
            self.set_condition("OPERation", RANGING, False)
        return super().handle_line(line)

    def _range_query(self, args: str, table: tuple[float, ...], unit: str) -> str:
        if args.strip().upper() == "AUTO":  # every range, least sensitive first
            return ",".join(nr3(v) for v in reversed(table))
        index = self._range_index(args, table, unit, query=True)
        return nr3(table[self.gain if index is None else index])

    def _bandwidth_hz(self) -> float:
        return FILTERED_BANDWIDTH_HZ if self.filter else FREQUENCY_RANGE_HZ[1]

    # -- corrections ------------------------------------------------------------------------------

    def _responsivity(self, wavelength_nm: float | None = None) -> float:
        # InGaAs: about 0.9 A/W at 1310 nm to 1.0 A/W at 1550 nm (the photodiode model's slope)
        nm = self.wavelength_nm if wavelength_nm is None else wavelength_nm
        return 0.9 + (nm - 1310.0) * (0.1 / 240.0)

    def _responsivity_query(self, args: str) -> str:
        text = args.strip()
        word = keyword(text) if text else None
        if not text:
            return nr3(self._responsivity())
        if word == "MIN":
            return nr3(self._responsivity(WAVELENGTH.minimum))
        if word == "MAX":
            return nr3(self._responsivity(WAVELENGTH.maximum))
        if word == "DEF":
            return nr3(self._responsivity(WAVELENGTH.default))
        nm = parse_number(text, "M", units=WAVELENGTH.units)  # the curve at a wavelength in nm
        if not WAVELENGTH.minimum <= nm <= WAVELENGTH.maximum:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return nr3(self._responsivity(nm))

    def _zero(self, args: str) -> None:
        no_args(args)
        dark_w = 10 ** (self.head.read_dbm(self.world.now_ns(), self.world.now_ns()) / 10) / 1000
        self.zero_a = dark_w * self._responsivity() if self.head.tap is None else 0.0

    # -- measuring ------------------------------------------------------------------------------

    def _take(self) -> float:
        """The sensor's power in dBm, integrated over the averaging window (the user attenuation
        not yet added); with auto ranging the range that holds it becomes the range in use."""
        self._settle()
        window_ns = self.world.scaled_ns(self.averaging * SAMPLE_S)
        t0 = self.world.now_ns()
        time.sleep(window_ns / 1e9)  # the meter integrates light for this long before it answers
        dbm = self.head.read_dbm(t0, t0 + window_ns)
        if self.auto_range:
            self.gain = self._fit(POWER_RANGES_W, 10 ** (dbm / 10) / 1000)
        return dbm

    def _frequency(self) -> float:
        """Rising edges of the light through the threshold over the gate, per second."""
        gate_ns = self.world.scaled_ns(FREQUENCY_GATE_S)
        t0 = self.world.now_ns()
        time.sleep(gate_ns / 1e9)
        if self.head.tap is None:
            return 0.0
        samples = []
        for i in range(FREQUENCY_SAMPLES):
            dbm = self.world.port_power_dbm(self.head.tap.port, int(t0 + (i + 0.5) * gate_ns / FREQUENCY_SAMPLES))
            samples.append(0.0 if dbm is None else 10 ** ((dbm - self.head.tap.loss_db) / 10) / 1000)
        if self.auto_range:  # the range follows the signal's peaks
            self.gain = self._fit(POWER_RANGES_W, max(samples))
        threshold_w = self.threshold_pct / 100 * POWER_RANGES_W[self.gain]
        high = [w > threshold_w for w in samples]
        edges = sum(1 for before, now in zip(high, high[1:]) if now and not before)
        return edges / FREQUENCY_GATE_S

    def _acquire(self, configuration: str) -> tuple[str, float]:
        if configuration == "FREQ":
            return configuration, self._frequency()
        if configuration in ("TEMP", "RES"):
            return configuration, HEAD_TEMPERATURE_C
        return configuration, self._take()

    def _format(self, reading: tuple[str, float]) -> str:
        configuration, value = reading
        if configuration in ("FREQ", "TEMP"):
            return nr3(value)
        if configuration == "RES":
            kelvin, kelvin0 = value + 273.15, 25.0 + 273.15
            return nr3(NTC_R0_OHM * math.exp(NTC_BETA_K * (1 / kelvin - 1 / kelvin0)))
        if "out_of_range" in self.faults:
            return nr3(OVER_RANGE)
        sensor_w = 10 ** (value / 10) / 1000
        if configuration == "CURR":
            amps = sensor_w * self._responsivity()
            if amps > CURRENT_RANGES_A[self.gain] * (1 + 1e-9):
                return nr3(OVER_RANGE)
            return nr3(amps - self.reference_a if self.relative_current else amps)
        if sensor_w > POWER_RANGES_W[self.gain] * (1 + 1e-9):
            return nr3(OVER_RANGE)
        dbm = value + self.input_loss_db  # the meter adds the declared input loss back (an attenuator in front)
        watts = 10 ** (dbm / 10) / 1000
        if configuration == "PDEN":
            area_cm2 = math.pi * (self.beam_mm / 20) ** 2
            return nr3(watts / area_cm2)
        if self.relative:
            if self.unit == "DBM":
                reference_dbm = -999.0 if self.reference_w <= 0 else 10 * math.log10(self.reference_w * 1000)
                return nr3(dbm - reference_dbm)
            watts -= self.reference_w
        return nr3(dbm if self.unit == "DBM" else watts)

    def _abort(self, args: str) -> None:
        no_args(args)
        self.continuous, self.last = False, None

    def _configure(self, args: str, configuration: str) -> None:
        no_args(args)
        self.configured, self.continuous, self.last = configuration, False, None

    def _initiate(self, args: str) -> None:
        no_args(args)
        self.last = self._acquire(self.configured)

    def _configure_and_initiate(self, args: str) -> None:
        self._configure(args, "POW")
        self._initiate(args)

    def _initiate_continuous(self, args: str) -> None:
        no_args(args)
        self.continuous = True

    def _fetch(self, args: str) -> str:
        no_args(args)  # an offset is for the PM400's scope mode only
        if self.continuous:
            self.last = self._acquire(self.configured)
        if self.last is None:
            raise ScpiError(*DATA_STALE)
        return self._format(self.last)

    def _read(self, args: str) -> str:
        no_args(args)
        self.last = self._acquire(self.configured)
        return self._format(self.last)

    def _measure(self, args: str, configuration: str) -> str:
        no_args(args)
        self.configured, self.continuous = configuration, False
        self.last = self._acquire(configuration)
        return self._format(self.last)
