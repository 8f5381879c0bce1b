"""The two switches against their manual files (instruments/emulators/manuals/polatis.yaml and
dicon-matrix.yaml): what the generic conformance test cannot see: the forms the manuals' sources give beyond one send each
(SUBtract with an empty list, a <mode> argument, the second network interface, a switch without
monitors; the DiCon's CHannel token left out, *RST and *CLS, other products' commands)."""

from __future__ import annotations

import re

import pytest

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators import conformance
from lumion_hil.instruments.emulators.dicon import DiconEmulator
from lumion_hil.instruments.emulators.polatis import PolatisEmulator
from lumion_hil.instruments.emulators.world import World
from conftest import BENCHES

BENCH_OF = {"polatis": "emulated.yaml", "dicon-matrix": "emulated-serial.yaml"}


def _bench(model: str):
    bench = load_bench(BENCHES / BENCH_OF[model], time_scale=0.01)
    name, spec = next((n, s) for n, s in bench.instruments.items() if s.model == model)
    return bench, name, spec


def _polatis(**changes):
    bench, name, spec = _bench("polatis")
    if changes:
        spec = spec.model_copy(update=changes)
    world = World(bench)
    return PolatisEmulator(name, spec, world), world


def _dicon():
    bench, name, spec = _bench("dicon-matrix")
    world = World(bench)
    return DiconEmulator(name, spec, world), world


def _errors(device, manual) -> list[int]:
    codes = []
    for _ in range(40):
        reply = device.handle_line(manual.error_query) or ""
        if reply.strip() == manual.no_error:
            break
        codes.append(int(re.match(r"\s*([+-]?\d+)", reply).group(1)))
    return codes


def _new(model: str):
    return _polatis()[0] if model == "polatis" else _dicon()[0]


@pytest.mark.parametrize("model", ["polatis", "dicon-matrix"])
def test_the_manual_files_describe_every_command(model):
    manual = conformance.load(model)
    assert manual.sources and manual.notes
    for command in manual.commands:
        assert command.section, f"{command.command}: no section"
    headers = [c.command for c in manual.commands]
    assert len(headers) == len(set(headers)), "a command listed twice"


# -- Polatis ------------------------------------------------------------------------------------

POLATIS = conformance.load("polatis")


def test_subtract_with_an_empty_list_removes_the_listed_ports_connections():
    device, world = _polatis()
    device.handle_line(":OXC:SWIT:CONN:ADD (@1,2,3),(@17,18,19)")
    device.handle_line(":OXC:SWIT:CONN:SUB (@1,2,5),(@)")  # 5 has no connection: left as it is
    assert _errors(device, POLATIS) == []
    assert world.connections() == {3: 19}
    device.handle_line(":OXC:SWIT:CONN:SUB (@),(@19)")
    assert world.connections() == {}
    device.handle_line(":OXC:SWIT:CONN:SUB (@17),(@)")  # an egress port in the ingress list
    assert _errors(device, POLATIS) == [-222]


def test_subtract_of_a_pair_not_connected_is_a_conflict():
    device, world = _polatis()
    device.handle_line(":OXC:SWIT:CONN:ADD (@1),(@17)")
    device.handle_line(":OXC:SWIT:CONN:SUB (@1),(@18)")
    assert _errors(device, POLATIS) == [-221]
    assert world.connections() == {1: 17}


@pytest.mark.parametrize("header", [":OXC:SWIT:CONN:ADD", ":OXC:SWIT:CONN:ONLY", ":OXC:SWIT:CONN:SUB"])
def test_a_mode_argument_is_refused_and_nothing_moves(header):
    device, world = _polatis()
    device.handle_line(f"{header} (@1),(@17),ANY")
    assert _errors(device, POLATIS) == [-224]
    assert world.connections() == {}


def test_the_network_query_parses_as_the_published_client_reads_it():
    device, _ = _polatis()
    reply = device.handle_line(":syst:comm:netw:addr?")
    pairs = dict(pair.split("=") for pair in reply.split())  # devicecontrol-polatis's network_config
    assert {k: v.strip('"') for k, v in pairs.items()} == {
        "IP": "127.0.0.1", "Gateway": "0.0.0.0", "Mask": "255.0.0.0", "Broadcast": "127.255.255.255"}
    assert device.handle_line(":SYST:COMM:NETW1:ADDR?") == reply
    assert device.handle_line(":SYST:COMM:NETW3:ADDR?") is None
    assert _errors(device, POLATIS) == [-114]


def test_a_switch_without_monitors_refuses_the_power_query_as_missing_hardware():
    device, _ = _polatis(power_monitors=False)
    assert device.handle_line(":PMON:POW? (@17)") is None
    assert _errors(device, POLATIS) == [-241]


def test_boot_mode_query_takes_no_argument():
    device, _ = _polatis()
    device.handle_line(":OXC:BOOT:MODE? DARK")
    assert _errors(device, POLATIS) == [-108]


# -- DiCon --------------------------------------------------------------------------------------

DICON = conformance.load("dicon-matrix")


def test_the_channel_token_may_be_left_out():
    device, world = _dicon()
    device.handle_line("X1 2 5")
    assert _errors(device, DICON) == []
    assert world.connections() == {2: 21}
    assert device.handle_line("X1 CH 2?") == "2,5"
    assert device.handle_line("X1 2?") == "2,5"
    assert device.handle_line("X1 CH? 2") == "5"


def test_reset_and_clear_status():
    device, world = _dicon()
    device.handle_line("X1 CH 1 3")
    device.handle_line("X1 CH 99 1")  # out of range: an entry on the queue
    device.handle_line("*CLS")
    assert _errors(device, DICON) == []
    device.handle_line("X1 CH 99 1")
    device.handle_line("*RST")
    assert _errors(device, DICON) == []
    assert world.connections() == {}


def test_every_input_to_one_output_is_out_of_range():
    device, world = _dicon()
    device.handle_line("X1 CH 1 3")
    device.handle_line("X1 CH * 4")
    assert _errors(device, DICON) == [-222]
    assert world.connections() == {1: 19}


@pytest.mark.parametrize("line", ["I1 3", "PK", "SL1:X1 CH 1 3"])
def test_other_products_commands_move_nothing(line):
    device, world = _dicon()
    device.handle_line("X1 CH 1 3")
    device.handle_line(line)
    assert _errors(device, DICON) == [-113]
    assert world.connections() == {1: 19}
