"""Emulated Keysight N7744A / N7745A multi-port power meter over the world, on raw SCPI/TCP.

The command tree of Keysight's N77xx programming guide (and the 8163A/B guide whose power-meter
commands it shares), transcribed with its state in ``manuals/keysight-n77xx.yaml``: optional
nodes (``:READ[n][:CHANnel[m]][:SCALar]:POWer[:DC]?``), MIN/MAX/DEF, units with SI multipliers
(``100US``, ``1550NM``, ``-20DBM``, ``10UW``), compound messages. Per channel: wavelength, unit
(0 or DBM, 1 or W/Watt), averaging time, range and auto range, auto gain, reference and relative
readings, input loss, zero, trigger input and output with their rearm flags, and the data
acquisition functions: logging (free-running, trigger input IGNore; started by the next trigger,
CMEasure; one sample per trigger, SMEasure), stability and min/max. Instrument-wide: the trigger
configuration (:TRIGger:CONFiguration DISabled/DEFault/PASSthrough/LOOPback: ``:TRIGger NODEA``
is a pulse at the input connector and has no effect while the connectors are disabled; in
LOOPback an output trigger, ``:TRIGger NODEB``, comes back as an input one), the SCPI status
registers OPERation and QUEStionable with condition, event, enable and both transition filters
(OPERation bit n: channel n's function running; QUEStionable bit n: channel n over range), the
date and time, the slots' identities.

Values the meter takes only from a set snap to it: ranges to the nearest of +10..-30 dBm in
10 dB steps (the guide: rounded to the closest multiple of 10), the averaging time to the nearest
1-2-5 step (1 us .. 10 s; no shorter than the bench's ``min_sample_interval_s``), the wavelength to
0.01 nm. Booleans and integers come back as ``+0``/``+1``. The error queue answers
``+0,"No error"`` when empty, as Keysight instruments do. Logging starts when
``FUNC:STAT LOGG,STAR`` is handled; sample i averages the light over [start + i*T, start +
(i+1)*T] from the world's history, so a trace shows a switch's transition where the world says it
happened. ``FUNC:STAT?`` answers ``LOGGING_STABILITY,PROGRESS`` while it runs and
``LOGGING_STABILITY,COMPLETE`` after (the strings public scripts wait on; ``NONE,COMPLETE`` when no
function ran: assumption). Logging and stability times are honoured exactly (a driver places its
samples by the interval it asked for), never scaled by the bench's time scale (which shortens the
emulator's own latencies only). Changing a setting of a logging channel stops its run. Over range
(fault ``out_of_range``): readings are the 9.91E37 sentinel.

Commands of the guides that cannot be on this bench (laser, attenuator, switch and optical-head
modules, the mainframe's display and lock, the network settings) are refused with the error a
real N77xx gives for them: see ``REFUSED`` in keysight_n77xx_tables.py.

The emulator is in parts: the number formats, settings' values and refused commands
(keysight_n77xx_tables.py), the channels and their data acquisition functions
(keysight_n77xx_channels.py), the status registers (keysight_n77xx_status.py); this module holds
the command tree, the settings, the readings and the instrument's clock.
"""

from __future__ import annotations

import datetime
import math
import random
import struct
import time

from lumion_hil.instruments.emulators.keysight_n77xx_channels import Channel
from lumion_hil.instruments.emulators.keysight_n77xx_status import N77xxStatus
from lumion_hil.instruments.emulators.keysight_n77xx_tables import (
    ATIME_STEPS_S,
    COUNT,
    LOSS_DB,
    RANGE_DBM,
    RANGE_INPUT_DBM,
    RANGES_DBM,
    REFERENCE_DBM,
    REFUSED,
    SI_TIME,
    TRIGGER_CONFIGURATIONS,
    WAVELENGTH_M,
    dbm_or_watt,
    flag,
    keysight_float,
    short_form,
)
from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    DATA_TYPE_ERROR,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    Number,
    ScpiError,
    boolean,
    choice,
    ieee_block,
    keyword,
    no_args,
    parse_number,
)


class KeysightN77xxEmulator(N77xxStatus):
    no_error = '+0,"No error"'  # Keysight's form; a clear-errors loop waits for exactly this

    def __init__(self, name: str, spec, world, bench, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.world = world
        self.min_interval_s = spec.emulation.min_sample_interval_s
        shortest = min(s for s in ATIME_STEPS_S if s >= self.min_interval_s * (1 - 1e-9))
        self.atime_steps = [s for s in ATIME_STEPS_S if s >= shortest]
        self.atime = Number(shortest, 10.0, max(shortest, 1e-4), "S")
        rng = random.Random(seed)
        taps = taps_for(bench, name)
        self.channels = {ch: Channel(PhotodiodeChannel(world, taps.get(ch), noise_db=spec.emulation.noise_db,
                                                        dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=rng,
                                                        offset_db=spec.emulation.offset_db))
                         for ch in range(1, spec.channels + 1)}
        self.model = "N7744A" if spec.channels <= 4 else "N7745A"
        self.identity = f"Keysight Technologies,{self.model},EMU{seed:05d},1.0.0"
        self.trigger_configuration = 1  # DEFault: the connectors enabled (assumption: the power-on setting)
        self.clock_offset_s = 0.0  # :SYSTem:DATE/:TIME move the instrument's clock, not the host's
        for pattern, error in REFUSED:
            self.refuse(pattern, error)
        self._preset_status()
        c = self.command
        head = "[n][:CHANnel[m]]"
        c("*IDN?", lambda a: no_args(a) or self.identity)
        c("*OPC?", lambda a: "1")
        c("*OPT?", lambda a: no_args(a) or ",".join("" for _ in self.channels))  # no options fitted
        c("*RST", self._reset)
        self._status_commands()
        c(":SYSTem:PRESet", self._reset)
        c(":SYSTem:DATE", self._set_date)
        c(":SYSTem:DATE?", lambda a: no_args(a) or "+{},+{},+{}".format(*self._now().timetuple()[0:3]))
        c(":SYSTem:TIME", self._set_time)
        c(":SYSTem:TIME?", lambda a: no_args(a) or "+{},+{},+{}".format(*self._now().timetuple()[3:6]))
        c(":SYSTem:COMMunicate:ETHernet:IPADdress[:CURRent]?", lambda a: '"127.0.0.1"')
        c(":SYSTem:COMMunicate:ETHernet:MACaddress?", lambda a: '"00-30-D3-00-00-01"')
        c(":SYSTem:COMMunicate:ETHernet:HOSTname?", lambda a: f'"{self.model}-EMU"')
        c(":SLOT[n]:EMPTy?", lambda a, n: flag(n not in self.channels))
        c(":SLOT[n]:IDN?", self._slot_idn)
        c(":SLOT[n]:OPTions?", lambda a, n: self._port(n) and '""')
        c(f":READ{head}[:SCALar]:POWer[:DC]?", self._read)
        c(f":FETCh{head}[:SCALar]:POWer[:DC]?", self._read)
        c(f":READ{head}[:SCALar]:POWer:ALL:CSV?", self._all_csv)
        c(f":FETCh{head}[:SCALar]:POWer:ALL:CSV?", self._all_csv)
        c(f":READ{head}[:SCALar]:POWer:ALL?", self._all_block)
        c(f":FETCh{head}[:SCALar]:POWer:ALL?", self._all_block)
        c(f":READ{head}[:SCALar]:POWer:ALL:CONFig?", self._all_config)
        c(f":FETCh{head}[:SCALar]:POWer:ALL:CONFig?", self._all_config)
        c(f":INITiate{head}[:IMMediate]", lambda a, n, m: self._channel(n, m) and None)
        c(f":INITiate{head}:CONTinuous", self._setter(lambda ch, a: setattr(ch, "continuous", boolean(a))))
        c(f":INITiate{head}:CONTinuous?", lambda a, n, m: flag(self._channel(n, m).continuous))
        c(f":SENSe{head}:POWer:WAVelength", self._setter(self._set_wavelength))
        c(f":SENSe{head}:POWer:WAVelength:ALL", self._set_wavelength_all)
        c(f":SENSe{head}:POWer:WAVelength?", lambda a, n, m: keysight_float(
            WAVELENGTH_M.query(a, self._channel(n, m).head.wavelength_nm * 1e-9)))
        c(":SENSe:POWer:WAVelength:ALL:CSV?", lambda a: no_args(a) or ",".join(
            keysight_float(ch.head.wavelength_nm * 1e-9) for ch in self.channels.values()))
        c(f":SENSe{head}:POWer:UNIT", self._setter(self._set_unit))
        c(f":SENSe{head}:POWer:UNIT?", lambda a, n, m: f"+{self._channel(n, m).unit}")
        c(":SENSe:POWer:UNIT:ALL:CSV?", lambda a: no_args(a) or ",".join(
            str(ch.unit) for ch in self.channels.values()))
        c(f":SENSe{head}:POWer:ATIMe", self._setter(self._set_atime))
        c(f":SENSe{head}:POWer:ATIMe?", lambda a, n, m: keysight_float(self.atime.query(a, self._channel(n, m).atime_s)))
        c(f":SENSe{head}:POWer:RANGe[:UPPer]", self._setter(self._set_range))
        c(f":SENSe{head}:POWer:RANGe[:UPPer]?", lambda a, n, m: keysight_float(
            RANGE_DBM.query(a, self._channel(n, m).range_dbm)))
        c(f":SENSe{head}:POWer:RANGe:AUTO", self._setter(lambda ch, a: setattr(ch, "auto_range", boolean(a))))
        c(f":SENSe{head}:POWer:RANGe:AUTO?", lambda a, n, m: flag(self._channel(n, m).auto_range))
        c(f":SENSe{head}:POWer:GAIN:AUTO", self._setter(lambda ch, a: setattr(ch, "auto_gain", boolean(a))))
        c(f":SENSe{head}:POWer:GAIN:AUTO?", lambda a, n, m: flag(self._channel(n, m).auto_gain))
        c(f":SENSe{head}:POWer:REFerence", self._setter(self._set_reference))
        c(f":SENSe{head}:POWer:REFerence?", self._reference)
        c(f":SENSe{head}:POWer:REFerence:STATe", self._setter(lambda ch, a: setattr(ch, "relative", boolean(a))))
        c(f":SENSe{head}:POWer:REFerence:STATe?", lambda a, n, m: flag(self._channel(n, m).relative))
        c(f":SENSe{head}:CORRection[:LOSS][:INPut][:MAGNitude]", self._setter(
            lambda ch, a: setattr(ch, "loss_db", LOSS_DB.parse(a))))
        c(f":SENSe{head}:CORRection[:LOSS][:INPut][:MAGNitude]?", lambda a, n, m: keysight_float(
            LOSS_DB.query(a, self._channel(n, m).loss_db)))
        c(f":SENSe{head}:CORRection:COLLect:ZERO", lambda a, n, m: self._channel(n, m) and None)
        c(f":SENSe{head}:CORRection:COLLect:ZERO?", lambda a, n, m: self._channel(n, m) and "+0")
        c(":SENSe:CORRection:COLLect:ZERO:ALL", lambda a: None)
        c(":SENSe:CORRection:COLLect:ZERO:ALL?", lambda a: "+0")
        c(f":TRIGger{head}:INPut", self._setter(self._set_trigger))
        c(f":TRIGger{head}:INPut?", lambda a, n, m: {"IGN": "IGNore", "SME": "SMEasure", "CME": "CMEasure",
                                                      "PAS": "PASSthru"}[self._channel(n, m).trigger])
        c(f":TRIGger{head}:INPut:REARm", self._setter(lambda ch, a: setattr(ch, "input_rearm", boolean(a))))
        c(f":TRIGger{head}:INPut:REARm?", lambda a, n, m: flag(self._channel(n, m).input_rearm))
        c(f":TRIGger{head}:OUTPut", self._setter(self._set_trigger_output))
        c(f":TRIGger{head}:OUTPut?", lambda a, n, m: {"DIS": "DISabled", "AVG": "AVGover", "MEAS": "MEASure",
                                                       "MOD": "MODulation"}[self._channel(n, m).trigger_output])
        c(f":TRIGger{head}:OUTPut:REARm", self._setter(lambda ch, a: setattr(ch, "output_rearm", boolean(a))))
        c(f":TRIGger{head}:OUTPut:REARm?", lambda a, n, m: flag(self._channel(n, m).output_rearm))
        c(":TRIGger", self._trigger_now)
        c(":TRIGger:CONFiguration", self._set_trigger_configuration)
        c(":TRIGger:CONFiguration?", lambda a: no_args(a) or f"+{self.trigger_configuration}")
        c(f":SENSe{head}:FUNCtion:PARameter:LOGGing", self._setter(self._set_logging))
        c(f":SENSe{head}:FUNCtion:PARameter:LOGGing?", lambda a, n, m: (
            f"+{self._channel(n, m).log_count},{keysight_float(self._channel(n, m).log_atime_s)}"))
        c(f":SENSe{head}:FUNCtion:PARameter:STABility", self._setter(self._set_stability))
        c(f":SENSe{head}:FUNCtion:PARameter:STABility?", lambda a, n, m: ",".join(keysight_float(v) for v in (
            self._channel(n, m).stab_total_s, self._channel(n, m).stab_delay_s, self._channel(n, m).stab_atime_s)))
        c(f":SENSe{head}:FUNCtion:PARameter:MINMax", self._setter(self._set_minmax))
        c(f":SENSe{head}:FUNCtion:PARameter:MINMax?", lambda a, n, m: (  # short forms: "WIND,+10" (816x guide p. 99)
            f"{short_form(self._channel(n, m).minmax_mode)},+{self._channel(n, m).minmax_points}"))
        c(f":SENSe{head}:FUNCtion:STATe", self._function)
        c(f":SENSe{head}:FUNCtion:STATe?", self._state)
        c(f":SENSe{head}:FUNCtion:RESult?", self._result)
        c(f":SENSe{head}:FUNCtion:RESult:BLOCk?", self._result_block)
        c(f":SENSe{head}:FUNCtion:RESult:INDex?", self._result_index)

    # -- the slots' identities --------------------------------------------------------------------

    def _slot_idn(self, args: str, n: int) -> str:
        self._port(n)
        return f"Keysight Technologies,{self.model} port {n},EMU{n:05d},1.0.0"

    # -- power and reset ------------------------------------------------------------------------

    def power_on(self) -> None:
        super().power_on()
        for channel in getattr(self, "channels", {}).values():
            channel.__init__(channel.head)
        self.trigger_configuration = 1
        self.clock_offset_s = 0.0
        self._preset_status()

    def _setter(self, apply):
        def handler(args: str, n: int, m: int) -> None:
            channel = self._channel(n, m)
            if self._running(channel):
                self._stop(channel)  # a setting stops logging
            apply(channel, args.strip())

        return handler

    def _reset(self, args: str) -> None:
        no_args(args)
        for channel in self.channels.values():
            channel.__init__(channel.head)
        self.trigger_configuration = 1

    # -- the instrument's clock ------------------------------------------------------------------

    def _now(self) -> datetime.datetime:
        return datetime.datetime.now() + datetime.timedelta(seconds=self.clock_offset_s)

    def _integers(self, args: str, count: int) -> list[int]:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != count or not all(parts):
            raise ScpiError(*MISSING_PARAMETER)
        try:
            return [int(float(p)) for p in parts]
        except ValueError:
            raise ScpiError(*DATA_TYPE_ERROR) from None

    def _set_date(self, args: str) -> None:
        year, month, day = self._integers(args, 3)
        try:
            wanted = self._now().replace(year=year, month=month, day=day)
        except ValueError:
            raise ScpiError(*DATA_OUT_OF_RANGE) from None
        self.clock_offset_s += (wanted - self._now()).total_seconds()

    def _set_time(self, args: str) -> None:
        hour, minute, second = self._integers(args, 3)
        try:
            wanted = self._now().replace(hour=hour, minute=minute, second=second)
        except ValueError:
            raise ScpiError(*DATA_OUT_OF_RANGE) from None
        self.clock_offset_s += (wanted - self._now()).total_seconds()

    # -- settings ---------------------------------------------------------------------------------

    def _wavelength_nm(self, args: str) -> float:
        if keyword(args) is None and parse_number(args, "M") > 1e-3:  # "1550" with no unit: nm, as the guide allows
            args = f"{parse_number(args)}NM"
        return round(WAVELENGTH_M.parse(args) * 1e9, 2)  # the meter's resolution: 0.01 nm (assumption)

    def _set_wavelength(self, ch: Channel, args: str) -> None:
        ch.head.wavelength_nm = self._wavelength_nm(args)

    def _set_wavelength_all(self, args: str, n: int, m: int) -> None:
        self._channel(n, m)
        nm = self._wavelength_nm(args)
        for channel in self.channels.values():
            if self._running(channel):
                self._stop(channel)
            channel.head.wavelength_nm = nm

    def _set_unit(self, ch: Channel, args: str) -> None:
        value = args.upper()
        if value not in ("0", "1", "DBM", "W", "WATT"):
            raise ScpiError(*(MISSING_PARAMETER if not value else ILLEGAL_PARAMETER))
        ch.unit = 0 if value in ("0", "DBM") else 1

    def _set_atime(self, ch: Channel, args: str) -> None:
        seconds = self.atime.parse(args)
        # the nearest of the averaging times the meter has (1-2-5 steps), on a log scale
        ch.atime_s = min(self.atime_steps, key=lambda s: abs(math.log(s / seconds)))

    def _set_range(self, ch: Channel, args: str) -> None:
        if keyword(args):
            value = RANGE_DBM.parse(args)
        else:
            value = RANGE_INPUT_DBM.parse(args)
        ch.range_dbm = min(RANGES_DBM, key=lambda r: (abs(r - value), -r))  # the closest multiple of 10
        ch.auto_range = False

    def _set_reference(self, ch: Channel, args: str) -> None:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        mode = choice(parts[0], "TOREF", "TOMODule")
        ch.reference["TOREF" if mode == "TOREF" else "TOMOD"] = dbm_or_watt(parts[1], REFERENCE_DBM)

    def _reference(self, args: str, n: int, m: int) -> str:
        mode = choice(args or "TOREF", "TOREF", "TOMODule")
        return keysight_float(self._channel(n, m).reference["TOREF" if mode == "TOREF" else "TOMOD"])

    def _set_trigger(self, ch: Channel, args: str) -> None:
        ch.trigger = {"IGNORE": "IGN", "SMEASURE": "SME", "CMEASURE": "CME", "PASSTHRU": "PAS"}[
            choice(args, "IGNore", "SMEasure", "CMEasure", "PASSthru").upper()]

    def _set_trigger_output(self, ch: Channel, args: str) -> None:
        ch.trigger_output = {"DISABLED": "DIS", "AVGOVER": "AVG", "MEASURE": "MEAS", "MODULATION": "MOD"}[
            choice(args, "DISabled", "AVGover", "MEASure", "MODulation").upper()]

    def _set_trigger_configuration(self, args: str) -> None:
        value = args.strip()
        if value in ("0", "1", "2", "3"):
            self.trigger_configuration = int(value)
        else:
            self.trigger_configuration = TRIGGER_CONFIGURATIONS.index(choice(value, *TRIGGER_CONFIGURATIONS))

    def _trigger_now(self, args: str) -> None:
        """``:TRIGger NODEA`` (or 1): as if a pulse came in at the trigger input; ``NODEB`` (2)
        drives the output connector, which nothing here listens to, unless the configuration is
        LOOPback (an output trigger comes back in). With the connectors DISabled neither is
        effective (the guide's note on :TRIGger)."""
        node = choice(args if args.strip() not in ("1", "2") else {"1": "NODEA", "2": "NODEB"}[args.strip()],
                      "NODEA", "NODEB")
        if self.trigger_configuration == 0:
            return
        if node == "NODEB" and self.trigger_configuration != 3:
            return
        now = self.world.now_ns()
        for ch in self.channels.values():
            if ch.armed and ch.trigger == "CME":  # a complete measurement starts with the pulse
                ch.armed, ch.log_start_ns = False, now
            elif ch.sme_times is not None and ch.trigger == "SME" and len(ch.sme_times) < ch.count():
                ch.sme_times.append(now)  # a single measurement: one sample of the function

    def _time(self, text: str) -> float:
        return parse_number(text, "S", units=SI_TIME)

    def _set_logging(self, ch: Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ScpiError(*MISSING_PARAMETER)
        count, atime = COUNT.parse(parts[0]), self._time(parts[1])
        if not self.min_interval_s * (1 - 1e-9) <= atime <= 10:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.log_count, ch.log_atime_s = int(count), atime

    def _set_stability(self, ch: Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise ScpiError(*MISSING_PARAMETER)
        total, delay, atime = (self._time(p) for p in parts)
        if not (self.min_interval_s * (1 - 1e-9) <= atime <= 10 and 0 <= delay <= 1e5
                and atime + delay <= total <= 1e6 and total / (atime + delay) <= 1_000_000):
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.stab_total_s, ch.stab_delay_s, ch.stab_atime_s = total, delay, atime

    def _set_minmax(self, ch: Channel, args: str) -> None:
        parts = [p.strip() for p in args.split(",")]
        mode = choice(parts[0], "CONTinuous", "WINDow", "REFResh")
        points = 1
        if len(parts) > 2:
            raise ScpiError(*ILLEGAL_PARAMETER)
        if len(parts) == 2:
            points = int(COUNT.parse(parts[1]))
        elif mode != "CONTinuous":
            raise ScpiError(*MISSING_PARAMETER)
        ch.minmax_mode, ch.minmax_points = mode, points

    # -- readings ---------------------------------------------------------------------------------

    def _read(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        window = int(ch.atime_s * 1e9)
        t0 = self.world.now_ns()
        time.sleep(window / 1e9)  # the head integrates for its averaging time before it answers
        return keysight_float(self._value(ch, ch.head.read_dbm(t0, t0 + window)))

    def _all(self) -> list[float]:
        t0 = self.world.now_ns()
        window = max(int(ch.atime_s * 1e9) for ch in self.channels.values())
        time.sleep(window / 1e9)
        return [self._value(ch, ch.head.read_dbm(t0, t0 + window)) for ch in self.channels.values()]

    def _all_csv(self, args: str, n: int, m: int) -> str:
        return ",".join(keysight_float(v) for v in self._all())

    def _all_block(self, args: str, n: int, m: int) -> bytes:
        values = self._all()
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _all_config(self, args: str, n: int, m: int) -> bytes:
        """The slot and channel of each value :READ:POWer:ALL? returns, as uint16 pairs."""
        return ieee_block(b"".join(struct.pack("<HH", port, 1) for port in self.channels))
