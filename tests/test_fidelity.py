"""Recording, fidelity and calibration: a transcript of a run, replayed against a bench, and a
twin fitted to it ("the mystery lab")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lumion_hil.instruments import transcript
from conftest import BENCHES, ROOT

LUMION = [sys.executable, "-m", "lumion_hil"]
SCALE = 0.2


def _cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([*LUMION, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_a_file_that_is_no_transcript_is_a_clear_error(tmp_path):
    bad = tmp_path / "run.jsonl"
    bad.write_text('{"type": "run"}\n')
    done = _cli("fidelity", str(bad))
    assert done.returncode == 4
    assert "not a lumion-hil transcript" in done.stderr and "lumion-hil run --record" in done.stderr
    done = _cli("calibrate", str(bad), "-o", str(tmp_path / "twin.yaml"))
    assert done.returncode == 4 and "not a lumion-hil transcript" in done.stderr


def test_a_transcript_cut_short_by_a_kill_keeps_every_whole_line(tmp_path):
    path = tmp_path / "t.jsonl"
    recording = transcript.Transcript(path, bench="b", time_scale=1.0)
    transcript.install(recording)
    try:
        transcript.exchange("scpi", "ocs", 1, 2, command="*IDN?", reply="x")
    finally:
        transcript.install(None)
        recording.close()
    with path.open("a") as fh:
        fh.write('{"type": "scpi", "name": "oc')  # the kill came mid-line
    header, entries = transcript.read(path)
    assert header["bench"] == "b" and [e["command"] for e in entries] == ["*IDN?"]


def _mystery(text: str, seed: int) -> str:
    """The default bench with a lab's own physics. What calibrate fits: a slower, spread switch,
    two dirty connectors, one slow NIC. What it cannot (the open world): a far host behind a slow
    management network, a meter out of calibration, a switch slower in commands of several
    connections. And the lab's own seed."""
    swaps = [
        ("switching_time_s: 0.05     #", "switching_time_s: 0.073    #"),
        ("      insertion_loss_db: 1.5     #",
         "      switching_jitter_s: 0.008  # the mystery lab's spread\n"
         "      port_loss_db: {3: 2.0, 22: 3.0}  # its dirty connectors\n"
         "      multi_connection_extra_s: 0.015  # its controller, slower with several beams\n"
         "      insertion_loss_db: 1.5     #"),
        ("    - name: host1\n      gpus",
         "    - name: host1\n      emulation: {management_latency_s: 0.01}  # its far host\n      gpus"),
        ("    - name: host2\n      gpus", "    - name: host2\n      emulation: {link_up_time_s: 0.4}  # its slow NIC\n      gpus"),
        ("      noise_db: 0.02           # assumption\n      dark_floor_dbm: -60.0",
         "      noise_db: 0.02           # assumption\n      offset_db: 0.8           # its meter out of calibration\n"
         "      dark_floor_dbm: -60.0"),
        ("name: emulated-prototype", "name: mystery-lab"),
        ("  seed: 1 ", f"  seed: {seed} "),
    ]
    for old, new in swaps:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


# The suites whose exchanges fidelity compares (switching, light, carrier, job starts); the failure
# sequences, training throughput, collective bandwidth and the migration baseline add no kind of
# their own (and over 60% of a run's time).
PHYSICS_SUITES = "not failure_sequences and not training_throughput and not collective_bandwidth and not migration"
FITTED = {"instruments.ocs.emulation.switching_time_s", "instruments.ocs.emulation.switching_jitter_s",
          "instruments.ocs.emulation.port_loss_db", "topology.hosts.host2.emulation.lock_time_s+link_up_time_s"}
OPEN_WORLD = {"agent host1", "detector offset at port 21", "switch time per connection by command size"}


def _recording(bench: Path, results: Path) -> Path:
    """A recorded run of the suites whose exchanges are compared."""
    done = _cli("run", "--bench", str(bench), "--time-scale", str(SCALE), "--results", str(results), "--no-report",
                "-q", "-k", PHYSICS_SUITES, "--record")
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    return next((results / "records").glob("transcript-*.jsonl"))


def _fidelity(recording: Path, bench: Path, report: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = _cli("fidelity", str(recording), "--bench", str(bench), "--json", str(report))
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-2000:]
    return done, json.loads(report.read_text())


def test_a_serial_switchs_recording_replays_every_line_with_the_same_replies(tmp_path):
    """The replayer sends a serial switch's lines through its driver as it sends SCPI through a
    VISA session: a recording of the serial bench's circuit setup, replayed against the same
    bench, gets every exchange through and the recorded reply to every line. Timing is not
    judged. Red with queries sent as set commands (no reply, no error): 429 replies differ,
    where a reply missing near a switch command once passed as a matter of timing."""
    bench = BENCHES / "emulated-serial.yaml"
    done = _cli("run", "--bench", str(bench), "--time-scale", str(SCALE), "--results", str(tmp_path / "run"),
                "--no-report", "-q", "-k", "circuit_setup", "--record")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    recording = next((tmp_path / "run" / "records").glob("transcript-*.jsonl"))
    _, entries = transcript.read(recording)
    serial_lines = [e for e in entries if e["type"] == "serial"]
    assert len(serial_lines) > 100 and any("?" in e["command"] for e in serial_lines)
    _, report = _fidelity(recording, bench, tmp_path / "fidelity.json")
    assert report["exchanges"] == len([e for e in entries if e["type"] in ("scpi", "serial", "agent")])
    assert report["replies_differing"] == [] and report["identity_replies_differing"] == 0


@pytest.mark.alone  # timing judged against a recording
def test_the_mystery_lab_is_named_by_fidelity_and_matched_by_its_twin(tmp_path):
    """A lab whose physics calibrate is not told, partly of kinds it cannot fit, recorded twice
    through a suite run (each run its own seed). Fidelity of the default bench against the first
    recording names what differs, each a decision at a stated false-alarm rate
    (harness/decisions.py): parameters of the families calibrate fits, and the differences no
    such parameter explains. Calibrate fits a twin to the first recording; the twin, with a seed
    of its own, is judged by fidelity on the second recording, which it was not fitted to: no
    family it fits is shown to differ (but the switch's, which the open world's switch confounds),
    and what it cannot fit is still named.

    What a run of these suites at a fifth of real time cannot show is left unasserted and
    reported undecided: the switch's 8 ms spread and the slow NIC's bring-up (two samples a
    host), and the switch's command-size dependence (the per-connection time of commands of one
    connection carries the SCPI round trip's noise)."""
    # Independent steps run side by side (each waits on its bench's physics far more than it
    # computes: about a quarter of a core): the two recordings; then, on the first, fidelity
    # against the default bench and calibrate; then fidelity of the twin on the second.
    with ThreadPoolExecutor(2) as pool:  # left early (a failed assertion), it waits for the steps under way
        recordings = []
        for seed in (7, 8):
            lab = tmp_path / f"mystery-{seed}.yaml"
            lab.write_text(_mystery((BENCHES / "emulated.yaml").read_text(), seed))
            recordings.append(pool.submit(_recording, lab, tmp_path / f"lab-{seed}"))
        fitted_on = recordings[0].result()
        twin = tmp_path / "twin.yaml"
        fitting = pool.submit(_cli, "calibrate", str(fitted_on), "--bench", str(BENCHES / "emulated.yaml"), "-o", str(twin))

        default, report = _fidelity(fitted_on, BENCHES / "emulated.yaml", tmp_path / "default.json")
        assert default.returncode == 1, default.stdout[-3000:]
        named = {p["parameter"] for p in report["parameters"]}
        unexplained = {u["what"] for u in report["unexplained"]}
        assert {"instruments.ocs.emulation.switching_time_s", "instruments.ocs.emulation.port_loss_db"} <= named <= FITTED, \
            default.stdout
        assert {"agent host1", "detector offset at port 21"} <= unexplained <= OPEN_WORLD, default.stdout
        # 3->22: both dirty connectors on one path, 5 dB, within the decision's own interval (at
        # its stated false-alarm rate: a paired trimmed mean of a few readings, each with 0.02 dB
        # of noise, is known to about 0.05 dB; a fixed 0.02 dB window once failed at +4.97)
        assert re.search(r"light differs at ports 22 \(\+[45]\.\d\d dB\)", default.stdout), default.stdout
        lossy = report["powers"]["per_detector"]["3->22 ocs"]
        assert lossy["verdict"] == "differs" and lossy["low"] <= 5.0 <= lossy["high"], lossy
        assert "false-alarm rate 0.50% for all of them together" in default.stdout

        fitted = fitting.result()
        assert fitted.returncode == 0, fitted.stderr[-3000:]
        text = twin.read_text()
        assert "switching_time_s = 0.0" in text and "3-22" in text  # the lossy pair, fitted as a pair
        assert "seed: 1" in text  # the default bench's, not the lab's

        again, report = _fidelity(recordings[1].result(), twin, tmp_path / "twin.json")
        assert again.returncode == 1, again.stdout[-3000:]
        # Nothing calibrate fits is shown to differ, but for the switch's two numbers: a switch slower
        # only in commands of several is fitted one time per connection for both, a compromise (and
        # the extra time's spread taken for the switch's own), which a quiet machine may show.
        switch = {"instruments.ocs.emulation.switching_time_s", "instruments.ocs.emulation.switching_jitter_s"}
        assert {p["parameter"] for p in report["parameters"]} <= switch, again.stdout
        unexplained = {u["what"] for u in report["unexplained"]}
        assert {"agent host1", "detector offset at port 21"} <= unexplained <= OPEN_WORLD, again.stdout


def test_the_open_worlds_knobs_act_as_their_names_say(bench_cfg):
    """What the mystery lab is perturbed with beyond what calibrate fits: a switch slower in
    commands of several connections, a meter out of calibration, a slow management network."""
    import io
    import random
    import time

    from lumion_hil.instruments.emulators.agent import ManagementNetwork
    from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, Tap
    from lumion_hil.instruments.emulators.world import World

    ms = 1_000_000
    data = bench_cfg.model_dump()
    data["instruments"]["ocs"]["emulation"]["multi_connection_extra_s"] = 0.02
    from lumion_hil.harness.config import Bench

    world = World(Bench.model_validate(data), clock_ns=lambda: 10**12)
    t0 = world.now_ns()
    world.connect([(1, 20)])  # one connection: its switching time alone
    world.connect([(4, 17), (3, 22)])  # two: each 20 ms more
    assert [e.t_ns - t0 for e in world.events_of("circuit.lit")] == [50 * ms, 120 * ms, 190 * ms]

    class Light:  # 1 mW at the port, at the meter's wavelength
        def mean_power_mw(self, port, t0, t1):
            return 1.0

        def wavelength_at(self, port, t):
            return 1310.0

    meter = PhotodiodeChannel(Light(), Tap(21, 10.0), noise_db=0.0, dark_floor_dbm=-60, rng=random.Random(1),
                              wavelength_nm=1310.0, offset_db=0.8)
    assert meter.read_dbm(0, 1) == pytest.approx(-10.0 + 0.8)

    answers = io.BytesIO()
    sent = time.monotonic()
    network = ManagementNetwork(0.02, io.BytesIO(b'{"id": 1}\n'), answers)
    assert next(iter(network)) == b'{"id": 1}\n' and time.monotonic() - sent >= 0.01  # half the round trip in
    network.write(b'{"id": 1, "ok": true}\n')
    network.close()  # delivers what is under way: half the round trip out
    assert answers.getvalue() == b'{"id": 1, "ok": true}\n' and time.monotonic() - sent >= 0.02


def test_the_poll_that_ended_a_drivers_loop_is_found_and_a_reading_loop_is_not():
    """A driver polled a logging function until COMPLETE, then read the result: the replay asks
    that last poll again until its bench says COMPLETE too (else the result query, asked too
    early, answers with an error and no reply). A loop watching light is timed, not repeated."""
    from lumion_hil.harness.transcript_replay import poll_exits

    def scpi(t, name, command, reply):
        return {"type": "scpi", "name": name, "thread": 1, "t_ns": t, "done_ns": t + 1, "command": command,
                "reply": reply}

    entries = [scpi(0, "pm", ":SENS1:FUNC:STAT LOGG,STAR;*OPC?", "1"),
               scpi(10, "pm", ":SENS1:FUNC:STAT?", "LOGGING_STABILITY,PROGRESS"),
               scpi(20, "pm", ":SENS1:FUNC:STAT?", "LOGGING_STABILITY,PROGRESS"),
               scpi(30, "pm", ":SENS1:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
               scpi(40, "pm", ":SENS1:FUNC:RES?", [-3.0]),
               scpi(50, "usb", "MEAS:POW?", "1.0E-9"),
               scpi(60, "usb", "MEAS:POW?", "1.2E-3"),
               scpi(70, "usb", "*OPC?", "1")]
    assert poll_exits(entries) == {3: "LOGGING_STABILITY,COMPLETE"}
