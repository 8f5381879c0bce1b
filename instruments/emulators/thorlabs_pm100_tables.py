"""The Thorlabs PM100D emulator's tables: how the console writes numbers (NR3), the values its
settings take, its gain levels (the current and power ranges), the figures its measuring
assumes (sample time, settling, frequency gate, head temperature), and the commands it refuses:
what needs a sensor other than a photodiode (:data:`OTHER_SENSORS`) and the PM400's own
hardware (:data:`PM400_ONLY`), each with its error."""

from __future__ import annotations

from lumion_hil.instruments.emulators.scpi_grammar import HARDWARE_MISSING, SETTINGS_CONFLICT, Number

SAMPLE_S = 0.001
OVER_RANGE = 9.9e37  # what SCPI instruments send for a value they cannot give (SCPI-99 7.2.1.5)
WAVELENGTH = Number(800.0, 1700.0, 1550.0, "M", units={"NM": 1.0, "UM": 1e3})
AVERAGING = Number(1, 100000, 1)
# The gain levels, most sensitive first (assumption: 1-2-5 steps, 20 nA to 20 mA; see thorlabs_pm100.py).
CURRENT_RANGES_A = tuple(float(f"{m}e{e}") for e in range(-8, -1) for m in (1, 2, 5))[1:-1]
POWER_RANGES_W = CURRENT_RANGES_A  # the same gain levels in W, at a nominal 1 A/W
INPUT_LOSS = Number(-60.0, 60.0, 0.0, "DB")
REFERENCE_W = Number(0.0, 0.02, 0.0, "W")
REFERENCE_A = Number(0.0, CURRENT_RANGES_A[-1], 0.0, "A")
ZERO_A = Number(-1e-6, 1e-6, 0.0, "A")
BEAM_MM = Number(0.01, 50.0, 9.5, "M", units={"MM": 1.0})
BRIGHTNESS = Number(0.0, 1.0, 1.0)
CONTRAST = Number(0.0, 1.0, 0.5)
RANGE_SETTLE_S = 0.010  # the reference: a range change interrupts measuring for up to 10 ms
RANGING = 4  # STATus:OPERation:CONDition bit 2: ranging ongoing (the reference)
THRESHOLD_PCT = Number(1, 99, 50)  # peak detector / frequency threshold, % of the range in use
FREQUENCY_GATE_S = 0.5
FREQUENCY_SAMPLES = 500
FREQUENCY_RANGE_HZ = (1.0, 100e3)  # assumption: 1 Hz to the input stage's HI bandwidth
FILTERED_BANDWIDTH_HZ = 15.0  # the PM100D manual's LO bandwidth
HEAD_TEMPERATURE_C = 23.0
NTC_R0_OHM, NTC_BETA_K = 10e3, 3988.0
ADAPTERS = ("PHOTodiode", "THERmal", "PYRo", "PDA", "Q4", "LUMinance")
# CONFigure? answers (the PM400 reference's abbreviations)
CONFIGURATIONS = {"POW": "POW", "CURR": "CURR", "PDEN": "POWDENS", "FREQ": "FREQ", "TEMP": "TEMP", "RES": "RES"}


def nr3(value: float) -> str:
    """SCPI's NR3 format, as the PM100 answers numbers: 1.550000E+03."""
    return f"{value:.6E}"


def _conflict(what: str) -> tuple[int, str]:
    return SETTINGS_CONFLICT[0], f"Settings conflict; {what}"


NOT_ENERGY = _conflict("not an energy sensor")
NOT_THERMOPILE = _conflict("not a thermopile sensor")
NOT_THERMAL_OR_PYRO = _conflict("not a thermopile or pyroelectric sensor")
NOT_QUADRANT = _conflict("not a four quadrant thermopile sensor")
HAS_EEPROM = _conflict("sensor responsivity comes from its EEPROM: set the wavelength")


def _missing(what: str) -> tuple[int, str]:
    return HARDWARE_MISSING[0], f"Hardware missing; {what}"


# What needs a thermopile, pyroelectric or four-quadrant sensor, or a responsivity set (only
# adapters without a head EEPROM take one): the console answers so with a photodiode attached.
OTHER_SENSORS = {
    NOT_ENERGY: ("CONFigure[:SCALar]:ENERgy", "CONFigure[:SCALar]:EDENsity", "MEASure[:SCALar]:ENERgy?",
                 "MEASure[:SCALar]:EDENsity?", "[:SENSe[n]]:ENERgy:RANGe[:UPPer]",
                 "[:SENSe[n]]:ENERgy:RANGe[:UPPer]?", "[:SENSe[n]]:ENERgy:REFerence",
                 "[:SENSe[n]]:ENERgy:REFerence?", "[:SENSe[n]]:ENERgy:REFerence:STATe",
                 "[:SENSe[n]]:ENERgy:REFerence:STATe?", "[:SENSe[n]]:CORRection:ENERgy[:PYRO][:RESPonse]",
                 "[:SENSe[n]]:CORRection:ENERgy[:PYRO][:RESPonse]?"),
    NOT_THERMOPILE: ("INPut:THERmopile:ACCelerator[:STATe]", "INPut:THERmopile:ACCelerator[:STATe]?",
                     "INPut:THERmopile:ACCelerator:AUTO", "INPut:THERmopile:ACCelerator:AUTO?",
                     "INPut:THERmopile:ACCelerator:TAU", "INPut:THERmopile:ACCelerator:TAU?",
                     "[:SENSe[n]]:CORRection:POWer:THERmopile[:RESPonse]",
                     "[:SENSe[n]]:CORRection:POWer:THERmopile[:RESPonse]?"),
    NOT_THERMAL_OR_PYRO: ("CONFigure[:SCALar]:VOLTage[:DC]", "MEASure[:SCALar]:VOLTage[:DC]?",
                          "[:SENSe[n]]:VOLTage[:DC]:RANGe[:UPPer]", "[:SENSe[n]]:VOLTage[:DC]:RANGe[:UPPer]?",
                          "[:SENSe[n]]:VOLTage[:DC]:RANGe:AUTO", "[:SENSe[n]]:VOLTage[:DC]:RANGe:AUTO?",
                          "[:SENSe[n]]:VOLTage[:DC]:REFerence", "[:SENSe[n]]:VOLTage[:DC]:REFerence?",
                          "[:SENSe[n]]:VOLTage[:DC]:REFerence:STATe", "[:SENSe[n]]:VOLTage[:DC]:REFerence:STATe?"),
    NOT_QUADRANT: ("CONFigure[:SCALar]:POSition", "CONFigure[:SCALar]:Q4Voltage", "MEASure[:SCALar]:POSition?",
                   "MEASure[:SCALar]:Q4Voltage?", "[:SENSe[n]]:POSition:REFerence",
                   "[:SENSe[n]]:POSition:REFerence?", "[:SENSe[n]]:POSition:REFerence:COLLect[:INITiate]",
                   "[:SENSe[n]]:POSition:REFerence:COLLect:ABORt"),
    HAS_EEPROM: ("[:SENSe[n]]:CORRection:POWer[:PDIode][:RESPonse]",),
}



# The PM400's hardware the reference documents and a PM100D has not: its headers are known
# (never -113), the hardware is missing.
PM400_ONLY = {
    _missing("no LAN"): ("SYSTem:COMMunicate:LAN:HOSTname", "SYSTem:COMMunicate:LAN:HOSTname?"),
    _missing("no external NTC or environment sensor"): (
        "[:SENSe[n]]:CORRection:COEFficient:BETA", "[:SENSe[n]]:CORRection:COEFficient:BETA?",
        "[:SENSe[n]]:CORRection:COEFficient:RESistance", "[:SENSe[n]]:CORRection:COEFficient:RESistance?",
        "[:SENSe[n]]:DIGital:DATA?", "[:SENSe[n]]:HUMidity:DATA?", "[:SENSe[n]]:RESistance:DATA?",
        "[:SENSe[n]]:TEMPerature:DATA?", "[:SENSe[n]]:VOLTage:DATA?"),
    _missing("no customer calibration slots"): (
        "[:SENSe[n]]:CORRection:CSET:POINts", "[:SENSe[n]]:CORRection:CSET:PREamble",
        "[:SENSe[n]]:CORRection:CSET[m]:DEFine", "[:SENSe[n]]:CORRection:CSET[m]:POINts?",
        "[:SENSe[n]]:CORRection:CSET[m]:PREamble?", "[:SENSe[n]]:CORRection:CSET[m]:STATe",
        "[:SENSe[n]]:CORRection:CSET[m]:STATe?"),
    _missing("no GPIO pins"): ("SOURce:DIGital:DATA", "SOURce:DIGital:DATA?", "SOURce:DIGital:ENABle",
                               "SOURce:DIGital:ENABle?"),
    _missing("no array buffer"): ("CONFigure:ARRay[:POWer]", "CONFigure:ARRay:CURRent", "CONFigure:ARRay:PDENsity",
                                  "FETCh:ARRay?", "MEASure:ARRay[:POWer]?", "MEASure:ARRay:CURRent?",
                                  "MEASure:ARRay:PDENsity?"),
}
