"""A lab adds its own power meter without editing the project: one driver module, one emulator
module and one registry entry (instruments/registry.py), in a package of its own that registers
the entry by entry point. The plug-in here lives in a temporary folder, found through
PYTHONPATH as an installed package would be through site-packages, and the circuit and light
suites run with it emulated in place of one of the bench's meters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.instruments import registry
from lumion_hil.instruments import transcript as transcript_file

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "emulated.yaml"
REPLACED = "pm-usb"  # the bench's one-channel meter, behind the tap of host2's first receiver

# The lab's package: its meter answers its own identity and its own command set.
PLUGIN = {
    "acme_meter/__init__.py": '''
        """The Acme OPM-1, a one-channel optical power meter: its lumion-hil registry entry."""
        from lumion_hil.instruments.registry import InstrumentModel, Kind, PowerReplies

        MODEL = InstrumentModel(
            name="acme-opm",
            kind=Kind.POWER_METER,
            driver="acme_meter.driver:AcmeOpm",
            emulator="acme_meter.emulator:AcmeOpmEmulator",
            identity=(r"^acme", r"^OPM-"),
            power_replies=PowerReplies(read=r"^:?READ:POW(ER)?\\?$", unit=r"^:?UNIT:POW(ER)?\\s+(?P<unit>\\S+)",
                                       default_unit="DBM"),
        )
    ''',
    "acme_meter/driver.py": '''
        """Driver of the Acme OPM-1: SCPI over a VISA message session, readings in dBm."""
        from lumion_hil.instruments.protocols import Identity, PowerMeter, Reading
        from lumion_hil.instruments.scpi import ScpiInstrument, parse_identity


        class AcmeOpm(ScpiInstrument, PowerMeter):
            channels = 1
            error_query = "SYST:ERR?"

            def identify(self) -> Identity:
                return self.ask("*IDN?", parse_identity)

            def set_wavelength_nm(self, wavelength_nm: float, channel: int = 1) -> None:
                self.send(f"SENS:WAV {wavelength_nm:g}")

            def wavelength_nm(self, channel: int = 1) -> float:
                return self.ask("SENS:WAV?", float)

            def read_dbm(self, channel: int = 1) -> Reading:
                return self.ask("READ:POW?", float)
    ''',
    "acme_meter/emulator.py": '''
        """Emulated Acme OPM-1 over the bench's world: one photodiode behind the tap the bench's
        detectors give it, a reading averaged over the millisecond before the query."""
        import math
        import random

        from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
        from lumion_hil.instruments.emulators.scpi import ScpiDevice

        WINDOW_NS = 1_000_000


        class AcmeOpmEmulator(ScpiDevice):
            def __init__(self, name, spec, world, bench, seed=1):
                super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
                self.world = world
                self.head = PhotodiodeChannel(world, taps_for(bench, name).get(1), noise_db=spec.emulation.noise_db,
                                              dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=random.Random(seed))
                self.unit = "DBM"
                self.command("*IDN?", lambda a: f"ACME Photonics,OPM-1,EMU{seed:05d},0.9")
                self.command("*OPC?", lambda a: "1")
                self.command("*RST", lambda a: setattr(self, "unit", "DBM"))
                self.command(":SENSe:WAVelength", lambda a: setattr(self.head, "wavelength_nm", float(a)))
                self.command(":SENSe:WAVelength?", lambda a: f"{self.head.wavelength_nm:g}")
                self.command(":UNIT:POWer", lambda a: setattr(self, "unit", a.strip().upper()))
                self.command(":READ:POWer?", self._read)

            def _read(self, args):
                now = self.world.now_ns()
                dbm = self.head.read_dbm(now - WINDOW_NS, now)
                return f"{dbm:.4f}" if self.unit == "DBM" else f"{10 ** (dbm / 10) / 1000:.6e}"
    ''',
    "acme_meter-0.1.dist-info/METADATA": '''
        Metadata-Version: 2.1
        Name: acme-meter
        Version: 0.1
    ''',
    "acme_meter-0.1.dist-info/entry_points.txt": '''
        [lumion_hil.instruments]
        acme-opm = acme_meter:MODEL
    ''',
}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plug-in written to a folder of its own, and that folder on the path (of this process,
    and of the processes it starts)."""
    folder = tmp_path / "site"
    for name, text in PLUGIN.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    registry.refresh()
    yield folder
    monkeypatch.undo()
    registry.refresh()


def _bench_with(model: str, path: Path) -> Path:
    data = yaml.safe_load(BENCH.read_text())
    data["instruments"][REPLACED]["model"] = model
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_plugin_is_registered_beside_the_projects_own(plugin):
    acme = registry.model("acme-opm")
    assert acme.kind is registry.Kind.POWER_METER
    assert registry.names(registry.Kind.POWER_METER)[-1] == "acme-opm"  # after the project's own
    assert acme.driver_class().__name__ == "AcmeOpm"


def test_an_unknown_model_names_the_known_ones_plugins_included(plugin, tmp_path):
    with pytest.raises(BenchFileError) as caught:
        load_bench(_bench_with("acme-opm-2", tmp_path / "bench.yaml"))
    message = str(caught.value)
    assert f"instruments.{REPLACED}.model" in message
    assert "unknown power meter model 'acme-opm-2'" in message
    for known in registry.names(registry.Kind.POWER_METER):
        assert known in message
    assert "acme-opm" in registry.names(registry.Kind.POWER_METER)


def test_the_circuit_and_light_suites_run_with_the_plugin_meter(plugin, tmp_path):
    bench = load_bench(_bench_with("acme-opm", tmp_path / "bench.yaml"))
    assert bench.instruments[REPLACED].model == "acme-opm"
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "lumion_hil", "run", "--bench", str(tmp_path / "bench.yaml"), "--time-scale", "0.2",
         "--results", str(results), "--no-report", "--record", "-q", "-k", "test_circuit_setup or test_light"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
    detector = next(d for d in bench.detectors if d.instrument == REPLACED)

    # The light suite judged a circuit's light arrival from the plug-in meter's trace, and passed.
    (record,) = (results / "records").glob("run-*.jsonl")
    judged = [m for m in map(json.loads, record.read_text().splitlines())
              if m.get("type") == "measurement" and m.get("name") == "light_arrival_time"
              and (m.get("attrs") or {}).get("detector") == detector.name]
    assert judged and all(m["verdict"] == "pass" for m in judged), judged

    # The meter that answered was the plug-in's, through its own commands: every exchange with
    # it is in the run's transcript.
    (transcript,) = (results / "records").glob("transcript-*.jsonl")
    _, lines = transcript_file.read(transcript)
    exchanges = [e for e in lines if e.get("type") == "scpi" and e.get("name") == REPLACED]
    commands = {e["command"] for e in exchanges}
    assert {"SENS:WAV 1310", "READ:POW?"} <= commands, commands
    assert not [e for e in exchanges if e.get("error")]

    # and fidelity reads its power replies as its registry entry says: light seen at the port
    # its detector watches
    from lumion_hil.harness.transcript_analysis import analyse

    seen = [r for r in analyse(bench, lines).readings if r.instrument == REPLACED]
    assert seen and {r.port for r in seen} == {detector.port}
    assert max(r.dbm for r in seen) > -40, "the tapped receiver's light"
