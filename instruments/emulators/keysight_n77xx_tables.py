"""The Keysight N77xx emulator's tables: how the meter writes numbers (``+1``, ``-2.00000000E+001``),
the values its settings take (wavelength, averaging times, ranges, losses, references, counts),
and the commands of its programming guides it refuses, with the error a real N77xx gives for
each (:data:`REFUSED`)."""

from __future__ import annotations

import math
import re

from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    HARDWARE_MISSING,
    SETTINGS_CONFLICT,
    Number,
    ScpiError,
    keyword,
    parse_number,
)


SENTINEL = 9.91e37


def flag(on: bool) -> str:
    """Booleans come back as NR1 with a sign, like every integer this meter sends."""
    return "+1" if on else "+0"


def short_form(mnemonic: str) -> str:
    """A mnemonic's short form, its capitals: WINDow -> WIND."""
    return "".join(ch for ch in mnemonic if ch.isupper())


def keysight_float(value: float) -> str:
    """-20.0 -> '-2.00000000E+001' (three exponent digits, as the instrument prints)."""
    if value == 0:
        return "+0.00000000E+000"
    mantissa, exponent = f"{value:+.8E}".split("E")
    return f"{mantissa}E{int(exponent):+04d}"


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
SI_TIME = {"NS": 1e-9, "US": 1e-6, "MS": 1e-3, "S": 1.0, "KS": 1e3}


def dbm_or_watt(text: str, number: Number) -> float:
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
REFUSED = [
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
