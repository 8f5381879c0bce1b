"""The emulators against their vendors' programming references, transcribed as data
(instruments/emulators/manuals/): every implemented command in its long and its short form,
every refused one answered with an error, every declared one in its manual, and the generated
table in docs/ current."""

from __future__ import annotations

import re

import pytest

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators import conformance
from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import HEADER_TOKEN, compile_pattern, match_tokens
from lumion_hil.instruments.emulators.world import World
from conftest import BENCHES, ROOT

BENCH_OF = {"polatis": "emulated.yaml", "keysight-n77xx": "emulated.yaml", "thorlabs-pm100": "emulated.yaml",
            "dicon-matrix": "emulated-serial.yaml"}
MODELS = conformance.available()


def _emulator(model: str):
    """The model's emulator over a world of its bench, in this process (no transport: the
    transports have tests of their own)."""
    bench = load_bench(BENCHES / BENCH_OF[model], time_scale=0.01)
    world = World(bench)
    name, spec = next((n, s) for n, s in bench.instruments.items() if s.model == model)
    if model == "polatis":
        from lumion_hil.instruments.emulators.polatis import PolatisEmulator
        return PolatisEmulator(name, spec, world)
    if model == "keysight-n77xx":
        from lumion_hil.instruments.emulators.keysight_n77xx import KeysightN77xxEmulator
        return KeysightN77xxEmulator(name, spec, world, bench)
    if model == "thorlabs-pm100":
        from lumion_hil.instruments.emulators.thorlabs_pm100 import ThorlabsPM100Emulator
        return ThorlabsPM100Emulator(name, spec, world, bench)
    from lumion_hil.instruments.emulators.dicon import DiconEmulator
    return DiconEmulator(name, spec, world)


def _errors(device, manual) -> list[str]:
    """Empty the error queue; the entries it held."""
    found = []
    for _ in range(40):
        reply = device.handle_line(manual.error_query)
        text = reply.decode() if isinstance(reply, bytes) else (reply or "")
        if text.strip() == manual.no_error or not text.strip():
            break
        found.append(text.strip())
    return found


def _code(error: str) -> int:
    m = re.match(r"\s*([+-]?\d+)", error)
    return int(m.group(1)) if m else 0


def test_the_table_in_docs_is_current():
    path = ROOT / "docs" / "conformance.md"
    assert path.read_text() == conformance.document(), \
        "docs/conformance.md is stale: python -m lumion_hil.instruments.emulators.conformance --write docs/conformance.md"


def test_forms_of_a_pattern():
    assert conformance.forms("[:SENSe[n]]:POWer[:DC]:UNIT?") == (":SENSE1:POWER:DC:UNIT?", ":POW:UNIT?")
    assert conformance.forms(":OXC:SWITch:CONNect:ADD") == (":OXC:SWITCH:CONNECT:ADD", ":OXC:SWIT:CONN:ADD")
    assert conformance.forms("*IDN?") == ("*IDN?", "*IDN?")
    assert conformance.forms(":READ[n]:CHANnel[m]:POWer?", 2) == (":READ2:CHANNEL2:POWER?", ":READ2:CHAN2:POW?")


@pytest.mark.parametrize("model", MODELS)
def test_every_implemented_command_works_in_long_and_short_form(model):
    manual = conformance.load(model)
    device = _emulator(model)
    failures = []
    for command in manual.commands:
        if command.state != "implemented":
            continue
        for header in conformance.spellings(manual, command):
            _errors(device, manual)
            line = f"{header} {command.send}".strip()
            reply = device.handle_line(line)
            errors = _errors(device, manual)
            wanted = [] if command.expect_error is None else [command.expect_error]
            if [_code(e) for e in errors] != wanted:
                failures.append(f"{line!r}: errors {errors}, expected {wanted or 'none'}")
            elif header.endswith("?") and command.expect_error is None and reply in (None, "", b""):
                failures.append(f"{line!r}: a query with no reply")
            if command.command.upper().startswith(("*RST", "SYST:PRES", ":SYST:PRES")):
                device.handle_line("*CLS")
    assert not failures, f"{model}: " + "; ".join(failures)


@pytest.mark.parametrize("model", MODELS)
def test_every_refused_command_is_answered_with_the_error_its_reason_names(model):
    manual = conformance.load(model)
    device = _emulator(model)
    wrong = []
    for command in manual.commands:
        if command.state != "refused":
            continue
        header = conformance.spellings(manual, command)[0]
        _errors(device, manual)
        line = f"{header} {command.send}".strip()
        reply = device.handle_line(line)
        codes = [_code(e) for e in _errors(device, manual)]
        if codes != [command.refused_with] or reply not in (None, "", b""):
            wrong.append(f"{line!r}: reply {reply!r}, errors {codes}, its reason names {command.refused_with}")
    assert not wrong, f"{model}: " + "; ".join(wrong)


@pytest.mark.parametrize("model", [m for m in MODELS if conformance.load(m).syntax == "scpi"])
def test_every_command_the_emulator_declares_is_in_its_manual(model):
    manual = conformance.load(model)
    device = _emulator(model)
    assert isinstance(device, ScpiDevice)
    patterns = [(compile_pattern(c.command)[0], c.command.endswith("?")) for c in manual.commands
                if c.state == "implemented"]
    missing = []
    for declared in device._commands:
        long, _ = conformance.forms(declared.pattern)
        nodes = long.rstrip("?").lstrip(":").split(":")
        tokens = [(m.group(1), m.group(2)) for m in (HEADER_TOKEN.fullmatch(t) for t in nodes)]
        if not any(q == declared.query and match_tokens(items, tokens, []) is not None for items, q in patterns):
            missing.append(declared.pattern)
    assert not missing, f"{model}: declared by the emulator but not implemented in its manual file: {missing}"


# --- the reply stream over the wire ----------------------------------------------------------------

class _Wire:
    """A client's view of an instrument's transport: lines out, replies in (a line, or an IEEE
    488.2 definite-length block and its line end), as pyvisa and pyserial read them."""

    def __init__(self, resource: str, serial_port: bool, timeout_s: float = 2.0):
        self.resource, self.serial_port, self.timeout_s = resource, serial_port, timeout_s
        self.buffer = b""
        if serial_port:
            import serial
            self.port = serial.Serial(resource, timeout=0.05)
        else:
            import socket
            self.port = socket.create_connection(("127.0.0.1", int(resource.split("::")[2])), timeout=timeout_s)
            self.port.settimeout(0.05)
        self.eol = b"\r\n" if serial_port else b"\n"

    def send(self, line: str) -> None:
        data = line.encode("ascii") + self.eol
        self.port.write(data) if self.serial_port else self.port.sendall(data)

    def _more(self) -> bytes:
        if self.serial_port:
            return self.port.read(4096)
        try:
            return self.port.recv(65536)
        except OSError:  # the socket's short timeout: nothing yet
            return b""

    def reply(self) -> bytes | None:
        """The next reply, or None when none came within the timeout."""
        import time as _time
        deadline = _time.monotonic() + self.timeout_s
        while True:
            end = self._reply_end()
            if end is not None:
                reply, self.buffer = self.buffer[:end], self.buffer[end:]
                return reply.rstrip(b"\r\n")
            if _time.monotonic() > deadline:
                return None
            self.buffer += self._more()

    def _reply_end(self) -> int | None:
        data = self.buffer
        m = re.match(rb"#([1-9])", data)
        if m and len(data) >= 2 + int(m.group(1)):
            length = int(data[2:2 + int(m.group(1))])
            start = 2 + int(m.group(1))
            after = start + length
            nl = data.find(b"\n", after)
            return None if nl < 0 else nl + 1
        nl = data.find(b"\n")
        return None if nl < 0 else nl + 1

    def close(self) -> None:
        self.port.close()


WIRED = {"thorlabs-pm100": ("emulated.yaml", "pm-usb"), "keysight-n77xx": ("emulated.yaml", "pm-lab"),
         "polatis": ("emulated.yaml", "ocs"), "dicon-matrix": ("emulated-serial.yaml", "ocs")}


@pytest.mark.parametrize("model", MODELS)
def test_every_command_then_the_identity_reads_the_identity_back(model):
    """The class of bug that leaves a client one reply late: a command answered where the
    reference says it is not (or the reverse). Over the transport the instrument is served on,
    every command of the table in each spelling, then the identity query: what the table says
    the command answers is read, and the identity comes back next, every time."""
    from lumion_hil.instruments.emulators.bench import EmulatedBench

    manual = conformance.load(model)
    bench_file, name = WIRED[model]
    with EmulatedBench(load_bench(BENCHES / bench_file, time_scale=0.01)) as bench:
        serial_port = model == "dicon-matrix"
        wire = _Wire(bench.resources[name], serial_port)
        try:
            wire.send(manual.identity_query)
            identity = wire.reply()
            assert identity, f"{model}: no reply to {manual.identity_query}"
            out_of_step, sent = [], 0
            for command in manual.commands:
                for header in conformance.spellings(manual, command):
                    line = f"{header} {command.send}".strip()
                    wire.send(line)
                    sent += 1
                    if manual.answers(command) and wire.reply() is None:
                        out_of_step.append(f"{line!r}: its table says it answers; nothing came")
                        continue
                    wire.send(manual.identity_query)
                    back = wire.reply()
                    if back != identity:
                        out_of_step.append(f"{line!r} then {manual.identity_query}: read {back!r}")
                        wire.close()  # a client would reconnect; so does the test, to judge the next one alone
                        wire = _Wire(bench.resources[name], serial_port)
        finally:
            wire.close()
    assert sent > len(manual.commands) // 2
    assert not out_of_step, f"{model}: {len(out_of_step)} of {sent} lines leave the replies out of step: " + \
        "; ".join(out_of_step)
