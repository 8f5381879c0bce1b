"""Emulated DiCon GP600-class MEMS matrix switch in its X1 (3D matrix) configuration, on a
pseudo-terminal that pyserial opens like a real port.

The command set of DiCon's "3D Matrix MxN Switch RS232 Serial Port (ASCII) Command Set" as a
published driver for the GP600 uses it (gdsfactory/autosweep DiConGP600.py, tests/replay), and
the shared instrument reference's forms; every command with its state here is transcribed in
manuals/dicon-matrix.yaml (the manual itself was not found: it names the drivers read):

- ``*IDN?`` (``Dicon Fiberoptics Inc, GP600, <serial>, 7.0``), ``VER?``, ``SYST:CONF?`` (``X1``);
- ``X1 CH <in> <out>`` moves input ``in`` to output ``out`` (0: parked) and keeps the switch busy
  until the mirror settles (it handles one line at a time, so the next answer comes after);
  ``X1 CH <in>?`` answers ``<in>,<out>``; ``X1 CH? <in>`` answers ``<out>`` (the reference's
  form); ``X1 CH * 0`` and ``RESET`` park every input; ``REBOOT``;
- ``X1 <in> <out>`` and ``X1 <in>?``: the same with the CHannel token left out, which DiCon's
  GP700/GP750 manual allows for matrix switches (quoted in a published C# driver's comments);
  assumed to hold on the GP600, whose command family it is;
- ``X1 DIM?`` (``<inputs>,<outputs>``), ``X1 WAVESAVAIL?``, ``X1 W <nm>``, ``X1 W?``;
- ``WEN 0|1``, ``WEN?``: save the state, so that it survives a power loss (off: every mirror
  parks when power goes; assumption for the default);
- ``SYST:ERR?``: the error queue, ``+0, No Error`` when empty, entries ``<code>, <message>``;
  ``*CLS`` empties it and ``*RST`` parks every input and empties it (drivers of DiCon's GP750
  and 1xN modules send both; what they do on a GP600 is assumed).

Set commands answer nothing; what the switch refuses goes on the error queue (the numbers are
SCPI's: assumption, the driver prints only the "No Error" form). Commands of other DiCon
products (the 1xN module's ``I1``, ``PK``, ``CF?``, ``ID?``, ``EO``; the GP700's slot-addressed
``SL<n>:...``) are not in an X1 GP600's set and answer -113 "Undefined header". Lines may end
in CR, LF or CR LF; answers end in CR LF (assumption: both kinds of client then find their
terminator).
"""

from __future__ import annotations

import collections
import re

from lumion_hil.instruments.emulators.world import WorldError

NO_ERROR = "+0, No Error"
UNDEFINED = (-113, "Undefined header")
OUT_OF_RANGE = (-222, "Data out of range")
BUSY = (-200, "Execution error; busy")
DEVICE = (-300, "Device-specific error")
WAVELENGTHS = (1310, 1550)


class DiconEmulator:
    def __init__(self, name: str, spec, world, seed: int = 1):
        self.name = name
        self.world = world
        self.ingress_count, self.egress_count = spec.ports
        self.identity = f"Dicon Fiberoptics Inc, GP600, EMU{seed:05d}, 7.0"
        self.faults: dict[str, float | None] = {}  # see instruments/emulators/scpi.py FAULTS
        self.errors: collections.deque[tuple[int, str]] = collections.deque(maxlen=30)
        self.save_state = False
        self.wavelength = 1550

    def _settle(self) -> None:
        self.world.wait_settled()  # busy while the mirror moves

    def power_on(self) -> None:
        """Power came back: the error queue is empty; unless the state was saved (``WEN 1``)
        every mirror is parked."""
        self.errors.clear()
        if not self.save_state:
            self.world.disconnect(None)

    def _error(self, error: tuple[int, str]) -> None:
        self.errors.append(error)

    def _move(self, ingress: int, out: int) -> None:
        if ingress not in self.world.ingress_ports or not 0 <= out <= self.egress_count:
            return self._error(OUT_OF_RANGE)
        try:
            current = self.world.connections().get(ingress)
            if current is not None and current != out + self.ingress_count:
                self.world.disconnect([(ingress, current)])
            if out:
                self.world.connect([(ingress, out + self.ingress_count)])
        except WorldError:
            return self._error(OUT_OF_RANGE)
        self._settle()

    def _output(self, ingress: int) -> int | None:
        if ingress not in self.world.ingress_ports:
            self._error(OUT_OF_RANGE)
            return None
        egress = self.world.connections().get(ingress)
        return egress - self.ingress_count if egress else 0

    def handle_line(self, line: str) -> str | None:
        text = line.strip()
        if not text:
            return None
        reply = self._handle(text)
        if "errors" in self.faults and text.upper() not in ("SYST:ERR?", "*IDN?", "*CLS"):
            self._error(DEVICE)
        return reply

    def _handle(self, text: str) -> str | None:
        upper = re.sub(r"\s+", " ", text.upper())
        query = upper.endswith("?") or " CH? " in upper
        if "busy" in self.faults and not query:
            self._error(BUSY)
            return None
        if upper == "*IDN?":
            return self.identity
        if upper == "VER?":
            return self.identity.rsplit(",", 1)[1].strip()
        if upper == "SYST:CONF?":
            return "X1"
        if upper == "*CLS":
            self.errors.clear()
            return None
        if upper == "*RST":
            self.errors.clear()
            self.world.disconnect(None)
            return None
        if upper == "SYST:ERR?":
            if not self.errors:
                return NO_ERROR
            code, message = self.errors.popleft()
            return f"{code:+d}, {message}"
        if upper == "X1 DIM?":
            return f"{self.ingress_count},{self.egress_count}"
        if upper == "X1 WAVESAVAIL?":
            return ",".join(str(w) for w in WAVELENGTHS)
        if upper == "X1 W?":
            return str(self.wavelength)
        if upper == "WEN?":
            return "1" if self.save_state else "0"
        if m := re.fullmatch(r"WEN ([01])", upper):
            self.save_state = m.group(1) == "1"
            return None
        if m := re.fullmatch(r"X1 W (\d+(?:\.\d*)?)", upper):
            if float(m.group(1)) not in WAVELENGTHS:
                self._error(OUT_OF_RANGE)
            else:
                self.wavelength = int(float(m.group(1)))
            return None
        if m := re.fullmatch(r"X1 (?:CH )?(\d+) ?\?", upper):
            out = self._output(int(m.group(1)))
            return None if out is None else f"{int(m.group(1))},{out}"
        if m := re.fullmatch(r"X1 CH\? (\d+)", upper):
            out = self._output(int(m.group(1)))
            return None if out is None else str(out)
        if upper in ("X1 CH * 0", "RESET"):
            self.world.disconnect(None)
            return None
        if re.fullmatch(r"X1 CH \* \d+", upper):  # every input to one output: no such connection
            self._error(OUT_OF_RANGE)
            return None
        if m := re.fullmatch(r"X1 (?:CH )?(\d+) (\d+)", upper):
            self._move(int(m.group(1)), int(m.group(2)))
            return None
        if upper == "REBOOT":
            self.power_on()
            return None
        self._error(UNDEFINED)
        return None
