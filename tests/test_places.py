"""Benches shared through labgrid: a real coordinator and exporter on this machine (labgrid's own
programs), exporting the instruments `lumion-hil emulate` serves; places made with
labgrid-client as a lab engineer makes them (README: "A lab's benches as labgrid places")."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lumion_hil.harness.places import Holder, address_of, parse_ports, PlaceError

from conftest import BENCHES, needs, serve_bench

try:
    import labgrid  # noqa: F401 (its programs are what the tests run)
    LABGRID = True
except ImportError:
    LABGRID = False
BIN = Path(sys.executable).parent
pytestmark = [*needs("places", LABGRID, "labgrid is not installed (pip install 'lumion-hil[labgrid]')"),
              pytest.mark.xdist_group("labgrid")]  # one coordinator at a time is plenty for two cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(coordinator: str, *args: str) -> str:
    proc = subprocess.run([str(BIN / "labgrid-client"), "-x", coordinator, *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"labgrid-client {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@contextlib.contextmanager
def lab(tmp_path: Path, exporter_config: dict):
    """A labgrid coordinator and one exporter (named rig1) on loopback; yields the coordinator."""
    port = _free_port()
    coordinator = f"127.0.0.1:{port}"
    folder = tmp_path / "coordinator"
    folder.mkdir()
    (tmp_path / "exporter.yaml").write_text(yaml.safe_dump(exporter_config))
    logs = [open(tmp_path / "coordinator.log", "w"), open(tmp_path / "exporter.log", "w")]
    procs = [subprocess.Popen([str(BIN / "labgrid-coordinator"), "-l", coordinator], cwd=folder, stdout=logs[0],
                              stderr=subprocess.STDOUT)]
    try:
        until = time.monotonic() + 30
        while time.monotonic() < until:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.1)
        procs.append(subprocess.Popen([str(BIN / "labgrid-exporter"), "-c", coordinator, "-n", "rig1",
                                       str(tmp_path / "exporter.yaml")], cwd=tmp_path, stdout=logs[1],
                                      stderr=subprocess.STDOUT))
        wanted = sum(len(group) for group in exporter_config.values())
        while time.monotonic() < until:
            if len(_client(coordinator, "resources").split()) >= wanted:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the exporter never showed its resources: {(tmp_path / 'exporter.log').read_text()}")
        yield coordinator
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
        for log in logs:
            log.close()


def _visa(resource: str) -> dict:
    kind, url = resource.split("::", 1)
    return {"cls": "PyVISADevice", "type": kind, "url": url}


def _served_resources(served: Path) -> dict[str, str]:
    return {n: spec["resource"] for n, spec in yaml.safe_load(served.read_text())["instruments"].items()}


# Two benches on the default bench's switch: host0 and host1 (ports 1-4, 17-20) in a ring of
# their own, host2 and host3 (5-8, 21-24) in another.
HALVES = {"bench-a": (["host0", "host1"], [[1, 20], [4, 17], [2, 19], [3, 18]], "1-4,17-20"),
          "bench-b": (["host2", "host3"], [[5, 24], [8, 21], [6, 23], [7, 22]], "5-8,21-24")}


def _halves_bench(tmp_path: Path) -> Path:
    """The default bench with both halves' rings as its baseline (what the switch starts with)."""
    data = yaml.safe_load((BENCHES / "emulated.yaml").read_text())
    data["safety"]["baseline"] = [pair for _, rings, _ in HALVES.values() for pair in rings]
    data["job"]["ranks"] = ["host0", "host1"]
    out = tmp_path / "halves.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _place_bench(served: Path, out: Path, name: str, coordinator: str, half: bool = False) -> Path:
    """The served bench as a place's bench: instruments from the place; ``half``: only its half
    of the hosts, their detectors and their ring (a bench on part of a shared switch)."""
    data = yaml.safe_load(served.read_text())
    data["name"] = name
    data["place"] = {"coordinator": coordinator, "name": name}
    if half:
        hosts, ring, _ = HALVES[name]
        topology = data["topology"]
        topology["hosts"] = [h for h in topology["hosts"] if h["name"] in hosts]
        ports = {p for h in topology["hosts"] for n in h["nics"] for p in (n["tx_port"], n["rx_port"])}
        data["safety"]["baseline"] = ring
        data["detectors"] = [d for d in data["detectors"] if d["port"] in ports]
        meters = {d["instrument"] for d in data["detectors"]} | {data["topology"]["switch"]}
        data["instruments"] = {n: spec for n, spec in data["instruments"].items() if n in meters}
        data.pop("job", None), data.pop("electrical", None), data.pop("migration", None)
    for spec in data["instruments"].values():
        spec["resource"] = "place"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


# What these runs show is the place (who holds it, when, which ports), not timing: the suites'
# tests they take judge no time (the switch's identity, the light on each baseline circuit).
# Held to one core beside the other tests (scripts/tests), a switch command once took 0.28 s
# against the 0.125 s the circuit suite allows at a fifth of real time, and turned red a run
# whose place had done all it should (perf/flakes.py --beside-others).
UNTIMED = "test_switch_matches_bench or carries_light"


def _run(tmp_path: Path, bench: Path, results: str, *extra: str, k: str = UNTIMED) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LG_")}
    return subprocess.Popen([sys.executable, "-m", "lumion_hil", "run", "--bench", str(bench), "--results",
                             str(tmp_path / results), "--no-report", "-q", *extra, "-k", k],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _notes(tmp_path: Path, results: str) -> dict[str, dict]:
    record = next((tmp_path / results / "records").glob("run-*.jsonl"))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return {line["text"]: line for line in lines if line["type"] == "note" and line["text"].startswith("place ")}


def test_addresses_and_ports_from_a_place():
    assert address_of("ocs", "PyVISADevice", {"type": "TCPIP0", "url": "10.0.0.5::3082::SOCKET"}) \
        == "TCPIP0::10.0.0.5::3082::SOCKET"
    assert address_of("pm", "PyVISADevice", {"type": "TCPIP0", "url": "10.0.0.6"}) == "TCPIP0::10.0.0.6::INSTR"
    assert address_of("mx", "NetworkSerialPort", {"host": "rig1", "port": 5001, "protocol": "raw"}) \
        == "socket://rig1:5001"
    assert address_of("host0", "NetworkService", {"address": "10.0.1.1", "username": "lab"}) == "lab@10.0.1.1"
    assert address_of("host1", "NetworkService", {"address": "10.0.1.2", "username": "lab", "port": 2222}) \
        == "ssh://lab@10.0.1.2:2222"
    with pytest.raises(PlaceError, match="USBSerialPort"):
        address_of("x", "USBSerialPort", {})
    assert parse_ports("1-4,17-20, 9") == [1, 2, 3, 4, 17, 18, 19, 20, 9]
    with pytest.raises(PlaceError, match="not a port"):
        parse_ports("4-1")
    assert Holder("rig/lab", "lumion-hil run pid 1 on elsewhere since x", 1, "elsewhere").stale is None


def test_two_runs_on_one_place_take_turns_and_a_killed_run_is_named_and_released(tmp_path):
    with serve_bench(BENCHES / "emulated.yaml", tmp_path, 0.2) as (served, _, _):
        resources = _served_resources(served)
        with lab(tmp_path, {"optical-a": {n: _visa(r) for n, r in resources.items()}}) as coordinator:
            _client(coordinator, "-p", "bench-a", "create")
            _client(coordinator, "-p", "bench-a", "add-match", "rig1/optical-a/*")
            bench = _place_bench(served, tmp_path / "bench-a.yaml", "bench-a", coordinator)

            first = _run(tmp_path, bench, "first", "--wait", "120")
            second = _run(tmp_path, bench, "second", "--wait", "120")
            outs = [p.communicate(timeout=300)[0] for p in (first, second)]
            assert [p.returncode for p in (first, second)] == [0, 0], "\n".join(outs)
            assert any("waiting for place 'bench-a'" in out for out in outs), outs  # one queued for the other
            spans = sorted((_notes(tmp_path, r)["place acquired"]["since"],
                            _notes(tmp_path, r)["place released"]["time"]) for r in ("first", "second"))
            assert spans[0][1] <= spans[1][0], f"the two runs held the place at once: {spans}"

            # Busy without --wait: exit 6, naming who holds it.
            holder = _run(tmp_path, bench, "holder", k="test_circuit_setup or test_light or test_link_bringup")
            until = time.monotonic() + 60
            while "acquired: None" in _client(coordinator, "-p", "bench-a", "show") and time.monotonic() < until:
                time.sleep(0.2)
            busy = _run(tmp_path, bench, "busy")
            out = busy.communicate(timeout=120)[0]
            assert busy.returncode == 6 and "bench busy" in out and "lumion-hil run pid" in out, out
            # kill -9 of that run: its acquisition stays, the next run names it as stale.
            holder.kill()
            holder.wait()
            stale = _run(tmp_path, bench, "stale")
            out = stale.communicate(timeout=120)[0]
            assert stale.returncode == 6 and f"pid {holder.pid}" in out and "stale acquisition" in out, out
            release = subprocess.run([sys.executable, "-m", "lumion_hil", "bench", "release", "--bench", str(bench)],
                                     capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert release.returncode == 0 and f"lumion-hil run pid {holder.pid}" in release.stdout, release
            assert "acquired: None" in _client(coordinator, "-p", "bench-a", "show")
            after = _run(tmp_path, bench, "after")
            out = after.communicate(timeout=300)[0]
            assert after.returncode == 0, out


def test_two_places_share_one_switch_on_their_own_ports(tmp_path):
    with serve_bench(_halves_bench(tmp_path), tmp_path, 0.2) as (served, switch, _):
        resources = _served_resources(served)
        # labgrid acquires a resource for one place at a time: the shared switch is exported once
        # for each place (one address); which ports each owns is its place's ports tag.
        config = {"optical-a": {"ocs": _visa(resources["ocs"]), "pm-lab": _visa(resources["pm-lab"])},
                  "optical-b": {"ocs": _visa(resources["ocs"]), "pm-usb": _visa(resources["pm-usb"])}}
        with lab(tmp_path, config) as coordinator:
            for place, group in (("bench-a", "optical-a"), ("bench-b", "optical-b")):
                _client(coordinator, "-p", place, "create")
                _client(coordinator, "-p", place, "add-match", f"rig1/{group}/*")
                _client(coordinator, "-p", place, "set-tags", f"ports={HALVES[place][2]}", "switch=ocs1")
            a = _place_bench(served, tmp_path / "bench-a.yaml", "bench-a", coordinator, half=True)
            b = _place_bench(served, tmp_path / "bench-b.yaml", "bench-b", coordinator, half=True)
            runs = [_run(tmp_path, a, "a"), _run(tmp_path, b, "b")]
            outs = [p.communicate(timeout=300)[0] for p in runs]
            assert [p.returncode for p in runs] == [0, 0], "\n".join(outs)
            spans = [(_notes(tmp_path, r)["place acquired"]["since"], _notes(tmp_path, r)["place released"]["time"])
                     for r in ("a", "b")]
            assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], f"the runs did not overlap: {spans}"
            assert _notes(tmp_path, "a")["place acquired"]["ports"] == [1, 2, 3, 4, 17, 18, 19, 20]
            # Each bench's baseline is on the switch at the end, side by side.
            import pyvisa

            ocs = pyvisa.ResourceManager("@py").open_resource(switch, read_termination="\n", write_termination="\n")
            try:
                state = ocs.query(":OXC:SWIT:CONN:STAT?")
            finally:
                ocs.close()
            for bench in (a, b):
                for ingress, egress in yaml.safe_load(bench.read_text())["safety"]["baseline"]:
                    assert str(ingress) in state and str(egress) in state, (bench.name, state)
            # bench restore holds the place as a run does, and restores its half alone.
            restore = subprocess.run([sys.executable, "-m", "lumion_hil", "bench", "restore", "--bench", str(a)],
                                     capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert restore.returncode == 0 and "at its baseline (4 cross-connects)" in restore.stdout, restore
            assert "acquired: None" in _client(coordinator, "-p", "bench-a", "show")
            # Ports claimed by both places are refused before anything moves.
            _client(coordinator, "-p", "bench-b", "set-tags", "ports=4-8,21-24", "switch=ocs1")
            clash = _run(tmp_path, a, "clash")
            out = clash.communicate(timeout=120)[0]
            assert clash.returncode == 4 and "both claim port(s) [4]" in out, out
