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
real N77xx gives for them: see ``_REFUSED``.
"""

from __future__ import annotations

import datetime
import math
import random
import re
import struct
import time
from typing import final

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    DATA_STALE,
    DATA_TYPE_ERROR,
    HARDWARE_MISSING,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    SETTINGS_CONFLICT,
    Number,
    ScpiError,
    boolean,
    choice,
    ieee_block,
    keyword,
    no_args,
    parse_number,
)

SENTINEL = 9.91e37


def _flag(on: bool) -> str:
    """Booleans come back as NR1 with a sign, like every integer this meter sends."""
    return "+1" if on else "+0"


def _short(mnemonic: str) -> str:
    """A mnemonic's short form, its capitals: WINDow -> WIND."""
    return "".join(ch for ch in mnemonic if ch.isupper())


def keysight_float(value: float) -> str:
    """-20.0 -> '-2.00000000E+001' (three exponent digits, as the instrument prints)."""
    if value == 0:
        return "+0.00000000E+000"
    mantissa, exponent = f"{value:+.8E}".split("E")
    return f"{mantissa}E{int(exponent):+04d}"


@final  # never subclassed: always true, and its __init__ is the one to reset it with
class _Channel:
    def __init__(self, head: PhotodiodeChannel):
        self.head = head
        self.unit = 0
        self.atime_s = 0.0001
        self.auto_range = True
        self.auto_gain = True
        self.range_dbm = 10.0
        self.continuous = False
        self.trigger = "IGN"
        self.trigger_output = "DIS"
        self.input_rearm = False
        self.output_rearm = False
        self.armed = False  # a function started, waiting for a trigger (CMEasure)
        self.log_count = 100
        self.log_atime_s = 0.0001
        self.stab_total_s = 1.0
        self.stab_delay_s = 0.0
        self.stab_atime_s = 0.0001
        self.minmax_mode = "CONTinuous"
        self.minmax_points = 1
        self.log_start_ns: int | None = None
        self.kind = "LOGGing"  # the function last started: LOGGing, STABility or MINMax
        self.sme_times: list[int] | None = None  # the triggers of an SMEasure run, when one runs
        self.samples: list[float] | None = None  # a finished run's data array, kept as the meter keeps it
        self.function = "NONE"
        self.reference = {"TOREF": 0.0, "TOMOD": 0.0}
        self.relative = False
        self.loss_db = 0.0
        self.head.wavelength_nm = 1550.0

    # the function's samples: count, and window i's start offset and length, ns
    def step_ns(self) -> int:
        if self.kind == "STABility":
            return int((self.stab_delay_s + self.stab_atime_s) * 1e9)
        return int(self.log_atime_s * 1e9)

    def window_ns(self) -> int:
        return int((self.stab_atime_s if self.kind == "STABility" else self.log_atime_s) * 1e9)

    def count(self) -> int:
        if self.kind == "STABility":
            return max(1, int(self.stab_total_s / (self.stab_delay_s + self.stab_atime_s) + 1e-9))
        return self.log_count


WAVELENGTH_M = Number(1250e-9, 1650e-9, 1550e-9, "M")
ATIME_STEPS_S = sorted(k * 10.0 ** e for e in range(-6, 2) for k in (1, 2, 5) if k * 10.0 ** e <= 10.0)
RANGES_DBM = (-30.0, -20.0, -10.0, 0.0, 10.0)
RANGE_DBM = Number(-30.0, 10.0, 10.0, "DBM")
RANGE_INPUT_DBM = Number(-35.0, 14.999, 10.0, "DBM")  # what rounds to one of the ranges
LOSS_DB = Number(-200.0, 200.0, 0.0, "DB")
REFERENCE_DBM = Number(-200.0, 200.0, 0.0, "DBM", units={"DB": 1.0, "MDB": 1e-3})
REGISTER = Number(0, 65535, 0, integer=True)
COUNT = Number(1, 1_000_000, 100, integer=True)
TRIGGER_CONFIGURATIONS = ("DISabled", "DEFault", "PASSthrough", "LOOPback")
_SI_TIME = {"NS": 1e-9, "US": 1e-6, "MS": 1e-3, "S": 1.0, "KS": 1e3}


def _dbm_or_watt(text: str, number: Number) -> float:
    """A power in dBm (``-10DBM``, ``-10``) or in W with a multiplier (``100UW``, ``1MW``,
    ``1E-3WATT``), as dBm."""
    if keyword(text) is None:
        m = re.fullmatch(r"\s*([+-]?[\d.]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", text)
        if m and m.group(2).upper() not in ("", "DBM", "MDBM", "DB", "MDB"):
            suffix = m.group(2).upper()
            unit = suffix[:-4] + "W" if suffix.endswith("WATT") else suffix
            watts = parse_number(m.group(1) + unit, "W")
            if watts <= 0:
                raise ScpiError(*DATA_OUT_OF_RANGE)
            text = f"{10 * math.log10(watts * 1000):.9g}"
    return number.parse(text)


# Commands of the programming guides that are not on this bench: (pattern, error). A real N77xx
# answers them so; the emulator does not declare them, so they are not part of its command tree.
_REFUSED = [
    # 8163/8164 modules that an N77xx has not: lasers, attenuators, switches, return loss
    (":SOURce[n][:CHANnel[m]]:WAVelength", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:WAVelength?", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:POWer[:LEVel][:IMMediate][:AMPLitude]", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:POWer[:LEVel][:IMMediate][:AMPLitude]?", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:POWer:STATe", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:POWer:STATe?", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:WAVelength:SWEep[:STATe]", HARDWARE_MISSING),
    (":SOURce[n][:CHANnel[m]]:WAVelength:SWEep[:STATe]?", HARDWARE_MISSING),
    (":OUTPut[n][:CHANnel[m]][:STATe]", HARDWARE_MISSING),
    (":OUTPut[n][:CHANnel[m]][:STATe]?", HARDWARE_MISSING),
    (":INPut[n][:CHANnel[m]]:ATTenuation", HARDWARE_MISSING),
    (":INPut[n][:CHANnel[m]]:ATTenuation?", HARDWARE_MISSING),
    (":ROUTe[n][:CHANnel[m]]", HARDWARE_MISSING),
    (":ROUTe[n][:CHANnel[m]]?", HARDWARE_MISSING),
    (":SENSe[n][:CHANnel[m]]:RETurnloss?", HARDWARE_MISSING),
    (":LOCK", HARDWARE_MISSING),
    (":LOCK?", HARDWARE_MISSING),
    (":SLOT[n]:HEAD[m]:EMPTy?", HARDWARE_MISSING),
    (":SLOT[n]:HEAD[m]:IDN?", HARDWARE_MISSING),
    (":SLOT[n]:HEAD[m]:OPTions?", HARDWARE_MISSING),
    (":SLOT[n]:HEAD[m]:WAVelength:RESPonse?", HARDWARE_MISSING),
    (":SLOT[n]:HEAD[m]:WAVelength:RESPonse:CSV?", HARDWARE_MISSING),
    # the 8163's display: an N77xx has none
    (":DISPlay:BRIGhtness", HARDWARE_MISSING),
    (":DISPlay:BRIGhtness?", HARDWARE_MISSING),
    (":DISPlay:CONTrast", HARDWARE_MISSING),
    (":DISPlay:CONTrast?", HARDWARE_MISSING),
    (":DISPlay:ENABle", HARDWARE_MISSING),
    (":DISPlay:ENABle?", HARDWARE_MISSING),
    (":DISPlay:LOCKout", HARDWARE_MISSING),
    (":DISPlay:LOCKout?", HARDWARE_MISSING),
    (":SENSe[n][:CHANnel[m]]:POWer:REFerence:DISPlay", HARDWARE_MISSING),
    # what would cut the harness off the meter, or is not emulated
    (":SYSTem:COMMunicate:GPIB[:SELF]:ADDRess", HARDWARE_MISSING),
    (":SYSTem:COMMunicate:GPIB[:SELF]:ADDRess?", HARDWARE_MISSING),
    (":SYSTem:COMMunicate:ETHernet:IPADdress[:STATic]", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:SMASk[:STATic]", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:DGATeway[:STATic]", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:DHCPenabled", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:AUTOenabled", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:HOSTname", SETTINGS_CONFLICT),
    (":SYSTem:COMMunicate:ETHernet:RESet", SETTINGS_CONFLICT),
    (":SPECial:REBoot", SETTINGS_CONFLICT),
    (":TRIGger:CONFiguration:EXTended", SETTINGS_CONFLICT),
    (":TRIGger:CONFiguration:EXTended?", SETTINGS_CONFLICT),
    (":SENSe[n][:CHANnel[m]]:POWer:REFerence:STATe:RATio", SETTINGS_CONFLICT),
    (":SENSe[n][:CHANnel[m]]:POWer:REFerence:STATe:RATio?", SETTINGS_CONFLICT),
]


class KeysightN77xxEmulator(ScpiDevice):
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
        self.channels = {ch: _Channel(PhotodiodeChannel(world, taps.get(ch), noise_db=spec.emulation.noise_db,
                                                        dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=rng,
                                                        offset_db=spec.emulation.offset_db))
                         for ch in range(1, spec.channels + 1)}
        self.model = "N7744A" if spec.channels <= 4 else "N7745A"
        self.identity = f"Keysight Technologies,{self.model},EMU{seed:05d},1.0.0"
        self.trigger_configuration = 1  # DEFault: the connectors enabled (assumption: the power-on setting)
        self.clock_offset_s = 0.0  # :SYSTem:DATE/:TIME move the instrument's clock, not the host's
        for pattern, error in _REFUSED:
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
        c(":SLOT[n]:EMPTy?", lambda a, n: _flag(n not in self.channels))
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
        c(f":INITiate{head}:CONTinuous?", lambda a, n, m: _flag(self._channel(n, m).continuous))
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
        c(f":SENSe{head}:POWer:RANGe:AUTO?", lambda a, n, m: _flag(self._channel(n, m).auto_range))
        c(f":SENSe{head}:POWer:GAIN:AUTO", self._setter(lambda ch, a: setattr(ch, "auto_gain", boolean(a))))
        c(f":SENSe{head}:POWer:GAIN:AUTO?", lambda a, n, m: _flag(self._channel(n, m).auto_gain))
        c(f":SENSe{head}:POWer:REFerence", self._setter(self._set_reference))
        c(f":SENSe{head}:POWer:REFerence?", self._reference)
        c(f":SENSe{head}:POWer:REFerence:STATe", self._setter(lambda ch, a: setattr(ch, "relative", boolean(a))))
        c(f":SENSe{head}:POWer:REFerence:STATe?", lambda a, n, m: _flag(self._channel(n, m).relative))
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
        c(f":TRIGger{head}:INPut:REARm?", lambda a, n, m: _flag(self._channel(n, m).input_rearm))
        c(f":TRIGger{head}:OUTPut", self._setter(self._set_trigger_output))
        c(f":TRIGger{head}:OUTPut?", lambda a, n, m: {"DIS": "DISabled", "AVG": "AVGover", "MEAS": "MEASure",
                                                       "MOD": "MODulation"}[self._channel(n, m).trigger_output])
        c(f":TRIGger{head}:OUTPut:REARm", self._setter(lambda ch, a: setattr(ch, "output_rearm", boolean(a))))
        c(f":TRIGger{head}:OUTPut:REARm?", lambda a, n, m: _flag(self._channel(n, m).output_rearm))
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
            f"{_short(self._channel(n, m).minmax_mode)},+{self._channel(n, m).minmax_points}"))
        c(f":SENSe{head}:FUNCtion:STATe", self._function)
        c(f":SENSe{head}:FUNCtion:STATe?", self._state)
        c(f":SENSe{head}:FUNCtion:RESult?", self._result)
        c(f":SENSe{head}:FUNCtion:RESult:BLOCk?", self._result_block)
        c(f":SENSe{head}:FUNCtion:RESult:INDex?", self._result_index)

    # -- addressing -------------------------------------------------------------------------------

    def _channel(self, n: int, m: int = 1) -> _Channel:
        if n not in self.channels or m != 1:  # on N77xx the slot number is the port; channel is 1
            raise ScpiError(*HARDWARE_MISSING)
        return self.channels[n]

    # the older call sites name a channel by its slot only
    def _ch(self, n: int) -> _Channel:
        return self._channel(n)

    def _port(self, n: int) -> _Channel:
        return self._channel(n)

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

    # -- status registers (SCPI-99 chapter 9; the guides' STATus subsystem) --------------------

    def _preset_status(self) -> None:
        self.status = {name: {"CONDition": 0, "EVENt": 0, "ENABle": 0, "PTRansition": 32767, "NTRansition": 0}
                       for name in ("OPERation", "QUEStionable")}

    def _conditions(self) -> dict[str, int]:
        operation = questionable = 0
        for n, ch in self.channels.items():
            if self._running(ch):
                operation |= 1 << n  # channel n's summary: a data acquisition function in progress
            if "out_of_range" in self.faults:
                questionable |= 1 << n  # channel n's summary: its reading is over range
        return {"OPERation": operation, "QUEStionable": questionable}

    def _update_status(self) -> None:
        for name, now in self._conditions().items():
            register = self.status[name]
            before = register["CONDition"]
            rose, fell = now & ~before, before & ~now
            register["EVENt"] |= (rose & register["PTRansition"]) | (fell & register["NTRansition"])
            register["CONDition"] = now

    def handle_line(self, line: str):
        self._update_status()
        return super().handle_line(line)

    def status_byte(self) -> int:
        self._update_status()
        return super().status_byte()

    def _status_commands(self) -> None:
        c = self.command
        for name in ("OPERation", "QUEStionable"):
            def event(args: str, n=name) -> str:
                no_args(args)
                self._update_status()
                value, self.status[n]["EVENt"] = self.status[n]["EVENt"], 0  # reading clears it
                return f"+{value}"

            def condition(args: str, n=name) -> str:
                no_args(args)
                self._update_status()
                return f"+{self.status[n]['CONDition']}"

            c(f":STATus:{name}[:EVENt]?", event)
            c(f":STATus:{name}:CONDition?", condition)
            for register in ("ENABle", "PTRansition", "NTRansition"):
                c(f":STATus:{name}:{register}",
                  lambda a, n=name, r=register: self.status[n].__setitem__(r, int(REGISTER.parse(a))))
                c(f":STATus:{name}:{register}?", lambda a, n=name, r=register: f"+{self.status[n][r]}")

        def preset(args: str) -> None:
            no_args(args)
            for register in self.status.values():
                register.update(ENABle=0, PTRansition=32767, NTRansition=0)

        c(":STATus:PRESet", preset)

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

    def _set_wavelength(self, ch: _Channel, args: str) -> None:
        ch.head.wavelength_nm = self._wavelength_nm(args)

    def _set_wavelength_all(self, args: str, n: int, m: int) -> None:
        self._channel(n, m)
        nm = self._wavelength_nm(args)
        for channel in self.channels.values():
            if self._running(channel):
                self._stop(channel)
            channel.head.wavelength_nm = nm

    def _set_unit(self, ch: _Channel, args: str) -> None:
        value = args.upper()
        if value not in ("0", "1", "DBM", "W", "WATT"):
            raise ScpiError(*(MISSING_PARAMETER if not value else ILLEGAL_PARAMETER))
        ch.unit = 0 if value in ("0", "DBM") else 1

    def _set_atime(self, ch: _Channel, args: str) -> None:
        seconds = self.atime.parse(args)
        # the nearest of the averaging times the meter has (1-2-5 steps), on a log scale
        ch.atime_s = min(self.atime_steps, key=lambda s: abs(math.log(s / seconds)))

    def _set_range(self, ch: _Channel, args: str) -> None:
        if keyword(args):
            value = RANGE_DBM.parse(args)
        else:
            value = RANGE_INPUT_DBM.parse(args)
        ch.range_dbm = min(RANGES_DBM, key=lambda r: (abs(r - value), -r))  # the closest multiple of 10
        ch.auto_range = False

    def _set_reference(self, ch: _Channel, args: str) -> None:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        mode = choice(parts[0], "TOREF", "TOMODule")
        ch.reference["TOREF" if mode == "TOREF" else "TOMOD"] = _dbm_or_watt(parts[1], REFERENCE_DBM)

    def _reference(self, args: str, n: int, m: int) -> str:
        mode = choice(args or "TOREF", "TOREF", "TOMODule")
        return keysight_float(self._channel(n, m).reference["TOREF" if mode == "TOREF" else "TOMOD"])

    def _set_trigger(self, ch: _Channel, args: str) -> None:
        ch.trigger = {"IGNORE": "IGN", "SMEASURE": "SME", "CMEASURE": "CME", "PASSTHRU": "PAS"}[
            choice(args, "IGNore", "SMEasure", "CMEasure", "PASSthru").upper()]

    def _set_trigger_output(self, ch: _Channel, args: str) -> None:
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
        return parse_number(text, "S", units=_SI_TIME)

    def _set_logging(self, ch: _Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ScpiError(*MISSING_PARAMETER)
        count, atime = COUNT.parse(parts[0]), self._time(parts[1])
        if not self.min_interval_s * (1 - 1e-9) <= atime <= 10:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.log_count, ch.log_atime_s = int(count), atime

    def _set_stability(self, ch: _Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise ScpiError(*MISSING_PARAMETER)
        total, delay, atime = (self._time(p) for p in parts)
        if not (self.min_interval_s * (1 - 1e-9) <= atime <= 10 and 0 <= delay <= 1e5
                and atime + delay <= total <= 1e6 and total / (atime + delay) <= 1_000_000):
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.stab_total_s, ch.stab_delay_s, ch.stab_atime_s = total, delay, atime

    def _set_minmax(self, ch: _Channel, args: str) -> None:
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

    def _value(self, ch: _Channel, dbm: float) -> float:
        if "out_of_range" in self.faults:
            return SENTINEL
        dbm += ch.loss_db
        if ch.relative:
            return dbm - ch.reference["TOREF"]
        return dbm if ch.unit == 0 else 10 ** (dbm / 10) / 1000

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

    # -- data acquisition functions -------------------------------------------------------------

    def _function(self, args: str, n: int, m: int) -> None:
        ch = self._channel(n, m)
        parts = [p.strip().upper() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        function = choice(parts[0], "LOGGing", "STABility", "MINMax")
        action = choice(parts[1], "STARt", "STOP")
        if action == "STOP":
            self._stop(ch)
            return
        if ch.trigger == "PAS":
            raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; a passthru trigger input starts no function")
        if function == "MINMax" and ch.trigger != "IGN":
            raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; min/max runs free (trigger input IGNore)")
        ch.kind = function
        ch.function = "MINMAX" if function == "MINMax" else "LOGGING_STABILITY"
        ch.sme_times, ch.samples = None, None
        if ch.trigger == "CME":  # armed: the run starts at the next trigger
            ch.armed, ch.log_start_ns = True, None
        elif ch.trigger == "SME":  # each trigger takes one sample
            ch.armed, ch.log_start_ns, ch.sme_times = False, None, []
        else:
            ch.armed, ch.log_start_ns = False, self.world.now_ns()

    def _stop(self, ch: _Channel) -> None:
        ch.armed, ch.log_start_ns, ch.sme_times, ch.function, ch.samples = False, None, None, "NONE", None

    def _running(self, ch: _Channel) -> bool:
        if ch.armed:
            return True
        if ch.kind == "MINMax":
            return ch.log_start_ns is not None
        if ch.sme_times is not None:
            return len(ch.sme_times) < ch.count()
        return ch.log_start_ns is not None and not self._finished(ch)

    def _finished(self, ch: _Channel) -> bool:
        if ch.sme_times is not None:
            return len(ch.sme_times) >= ch.count()
        if ch.log_start_ns is None:
            return False
        end = ch.log_start_ns + (ch.count() - 1) * ch.step_ns() + ch.window_ns()
        return self.world.now_ns() >= end

    def _state(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        if ch.function == "NONE":
            return "NONE,COMPLETE"
        return f"{ch.function},{'PROGRESS' if self._running(ch) else 'COMPLETE'}"

    def _done(self, ch: _Channel) -> int:
        if ch.sme_times is not None:
            return len(ch.sme_times)
        if ch.log_start_ns is None:
            return 0
        elapsed = self.world.now_ns() - ch.log_start_ns - ch.window_ns()
        return 0 if elapsed < 0 else min(ch.count(), elapsed // max(1, ch.step_ns()) + 1)

    def _result_index(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        return f"+{0 if ch.kind == 'MINMax' else self._done(ch)}"

    def _samples(self, ch: _Channel) -> list[float]:
        if ch.kind == "MINMax":
            return self._minmax(ch)
        if ch.function == "NONE" or not self._finished(ch):
            raise ScpiError(*DATA_STALE)
        if ch.samples is not None:  # read again: the same array
            return ch.samples
        window = ch.window_ns()
        if ch.sme_times is not None:
            starts = list(ch.sme_times)
        else:
            assert ch.log_start_ns is not None  # finished, so started
            starts = [ch.log_start_ns + i * ch.step_ns() for i in range(ch.count())]
        ch.samples = [self._value(ch, ch.head.read_dbm(t, t + window)) for t in starts]
        return ch.samples

    def _minmax(self, ch: _Channel) -> list[float]:
        """Minimum, maximum and current reading since the start (CONTinuous), over the last N
        readings (WINDow), or since the last restart every N readings (REFResh). Readings are
        the channel's averaging time long; past 20000 of them the windows are widened (the
        extremes of shorter flashes are then averaged away)."""
        if ch.function == "NONE" or ch.log_start_ns is None:
            raise ScpiError(*DATA_STALE)
        now = self.world.now_ns()
        step = max(1, int(ch.atime_s * 1e9))
        done = max(1, (now - ch.log_start_ns) // step)
        first = 0
        if ch.minmax_mode == "WINDow":
            first = max(0, done - ch.minmax_points)
        elif ch.minmax_mode == "REFResh":
            first = (done - 1) // ch.minmax_points * ch.minmax_points
        start = ch.log_start_ns + first * step
        count = max(1, done - first)
        stride = max(1, math.ceil(count / 20000))
        readings = [self._value(ch, ch.head.read_dbm(start + i * step, start + min(i + stride, count) * step))
                    for i in range(0, count, stride)]
        current = self._value(ch, ch.head.read_dbm(now - step, now))
        return [min(readings), max(readings), current]

    def _result(self, args: str, n: int, m: int) -> bytes:
        values = self._samples(self._channel(n, m))
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _result_block(self, args: str, n: int, m: int) -> bytes:
        """``offset,count``: part of the result array, for runs too long for one transfer."""
        ch = self._channel(n, m)
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ScpiError(*MISSING_PARAMETER)
        offset, count = (int(Number(0, 1_000_000, 0, integer=True).parse(p)) for p in parts)
        values = self._samples(ch)
        if offset + count > len(values):
            raise ScpiError(*DATA_OUT_OF_RANGE)
        part = values[offset:offset + count]
        return ieee_block(struct.pack(f"<{len(part)}f", *part))

