"""Commands from real third-party scripts and drivers, replayed byte for byte against the
emulators over TCP: each gets the vendor's answer, or the vendor's error where the real
instrument refuses it. The transcripts and where each came from: tests/replay/*.txt."""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import serial

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench

REPLAY = Path(__file__).parent / "replay"


@dataclass
class Step:
    line: int
    command: str
    expect: str | None  # None: no reply
    poll: bool = False


@dataclass
class Source:
    name: str
    eol: bytes = b"\n"
    steps: list[Step] = field(default_factory=list)


@dataclass
class Transcript:
    instrument: str
    errors: str
    sources: list[Source]
    bench: Path


def parse(path: Path) -> Transcript:
    settings, sources = {}, []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("@"):
            key, _, value = text[1:].partition(" ")
            if key == "source":
                sources.append(Source(value))
            elif key == "eol":
                sources[-1].eol = value.encode().decode("unicode_escape").encode()
            elif key == "poll":
                command, _, expect = value.partition(" => ")
                sources[-1].steps.append(Step(number, command, expect, poll=True))
            else:
                settings[key] = value
            continue
        command, sep, expect = raw.partition(" => ")
        command = command.encode().decode("unicode_escape")  # "\n" inside a command: the script's own
        sources[-1].steps.append(Step(number, command, expect if sep else None))
    return Transcript(settings["instrument"], settings["errors"], sources,
                      (REPLAY / settings.get("bench", "bench.yaml")).resolve())


TRANSCRIPTS = {p.stem: parse(p) for p in sorted(REPLAY.glob("*.txt"))}


class Wire:
    """A raw socket (or serial port) to the emulated instrument: bytes out exactly as given,
    lines back."""

    def __init__(self, resource: str):
        self.sock = self.port = None
        if resource.upper().startswith("TCPIP"):
            self.sock = socket.create_connection(("127.0.0.1", int(resource.split("::")[2])), timeout=2)
        else:
            self.port = serial.Serial(resource, timeout=2)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        if self.sock:
            self.sock.sendall(data)
        else:
            self.port.write(data)

    def _fill(self) -> None:
        if self.port:
            chunk = self.port.read(max(1, self.port.in_waiting))
            if not chunk:
                raise TimeoutError("no reply")
            self.buffer += chunk
            return
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the instrument closed the connection")
        self.buffer += chunk

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.rstrip(b"\r")

    def block(self) -> bytes:
        """An IEEE 488.2 definite-length block and its line end."""
        while len(self.buffer) < 2:
            self._fill()
        assert self.buffer[:1] == b"#", f"not a block: {self.buffer[:20]!r}"
        digits = int(self.buffer[1:2])
        while len(self.buffer) < 2 + digits:
            self._fill()
        length = int(self.buffer[2:2 + digits])
        end = 2 + digits + length
        while len(self.buffer) < end + 1:
            self._fill()
        payload, rest = self.buffer[2 + digits:end], self.buffer[end:]
        assert rest[:1] == b"\n", "a block ends with its line end"
        self.buffer = rest[1:]
        return payload

    def pending(self) -> bytes:
        """Whatever arrived unasked (a reply to a command that should have had none)."""
        if self.port:
            self.buffer += self.port.read(self.port.in_waiting)
            return self.buffer
        self.sock.setblocking(False)
        try:
            self._fill()
        except (BlockingIOError, ConnectionError):
            pass
        finally:
            self.sock.setblocking(True)
            self.sock.settimeout(5)
        return self.buffer

    def close(self) -> None:
        (self.sock or self.port).close()


@pytest.fixture(scope="module")
def benches():
    """The emulated benches the transcripts name, each started once."""
    started: dict[Path, EmulatedBench] = {}
    yield lambda path: started.get(path) or started.setdefault(path, EmulatedBench(load_bench(path)).start())
    for emulated in started.values():
        emulated.stop()


def _fresh(bench: EmulatedBench, instrument: str) -> None:
    """Each source starts from the instrument's power-on state, nothing switched."""
    bench.world.disconnect(None)
    bench.emulators[instrument].power_on()


def _check(wire: Wire, step: Step, where: str, errors: str, eol: bytes) -> None:
    expect = step.expect
    if expect is None:
        return
    if expect.startswith("error "):
        wire.send(errors.encode() + eol)
        reply = wire.line().decode()
        code = int(reply.split(",")[0])
        assert code == int(expect.split()[1]), f"{where}: refused with {reply}, expected {expect}"
        return
    if expect.startswith("#block "):
        payload = wire.block()
        assert len(payload) == int(expect.split()[1]), f"{where}: block of {len(payload)} bytes, expected {expect}"
        return
    reply = wire.line().decode()
    if expect == "(empty)":
        assert reply == "", f"{where}: replied {reply!r}, expected an empty line"
    elif expect.startswith("~"):
        assert re.fullmatch(expect[1:], reply), f"{where}: replied {reply!r}, expected /{expect[1:]}/"
    else:
        assert reply == expect, f"{where}: replied {reply!r}, expected {expect!r}"


@pytest.mark.parametrize("model", sorted(TRANSCRIPTS))
def test_replayed_commands_get_the_vendors_answers(benches, model):
    transcript = TRANSCRIPTS[model]
    replay_bench = benches(transcript.bench)
    resource = replay_bench.resources[transcript.instrument]
    wrong = []
    for source in transcript.sources:
        _fresh(replay_bench, transcript.instrument)
        wire = Wire(resource)
        origin = source.name.split(" ")[0]
        try:
            for step in source.steps:
                where = f"{model}.txt:{step.line} {step.command!r} ({origin})"
                if step.poll:  # ask until the awaited answer comes (a few seconds at most)
                    deadline = time.monotonic() + 5
                    while True:
                        wire.send(step.command.encode() + source.eol)
                        reply = wire.line().decode()
                        if reply == step.expect or time.monotonic() > deadline:
                            break
                        time.sleep(0.01)
                    if reply != step.expect:
                        wrong.append(f"{where}: still {reply!r}, never {step.expect!r}")
                    continue
                wire.send(step.command.encode() + source.eol)
                try:
                    _check(wire, step, where, transcript.errors, source.eol)
                except AssertionError as exc:
                    wrong.append(str(exc).splitlines()[0])
                    wire.send(b"*CLS" + source.eol)  # go on from a clean error queue
                except TimeoutError:
                    wrong.append(f"{where}: no reply within 5 s")
                    wire.close()
                    wire = Wire(resource)  # a late reply must not pass for the next one
            wire.send(transcript.errors.encode() + source.eol)  # nothing left unreported
            last = wire.line().decode()
            if int(last.split(",")[0]) != 0:
                wrong.append(f"{model} ({origin}): the error queue ends with {last}")
            if wire.pending():
                wrong.append(f"{model} ({origin}): unasked-for bytes {wire.pending()!r}")
        finally:
            wire.close()
    assert not wrong, "\n".join(wrong)


def test_each_model_replays_at_least_thirty_commands_with_their_source():
    for model, transcript in TRANSCRIPTS.items():
        assert sum(len(s.steps) for s in transcript.sources) >= 30, model
        assert all(re.search(r"\S+[@ ]", s.name) for s in transcript.sources), model
