"""The emulators' SCPI layer: headers, arguments, the error queue."""

from __future__ import annotations

import pytest

from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import ScpiError, parse_channel_list, split_top_level


@pytest.fixture
def device():
    dev = ScpiDevice("dev")
    dev.command(":OXC:SWITch:CONNect:STATe?", lambda a: "state")
    dev.command(":READ#:CHANnel#:POWer?", lambda a, slot, ch: f"{slot}/{ch}")
    dev.command("*IDN?", lambda a: "Vendor,Model,1,2")
    dev.command(":SENSe:POWer:UNIT", lambda a: None)
    return dev


@pytest.mark.parametrize("header", [":oxc:swit:conn:stat?", ":OXC:SWITCH:CONNECT:STATE?", "OXC:Switch:Conn:State?",
                                    ":oXc:SwItCh:CONN:STAT?"])
def test_short_long_and_any_case(device, header):
    assert device.handle_line(header) == "state"


@pytest.mark.parametrize("header", [":oxc:swi:conn:stat?", ":oxc:switc:conn:stat?", ":oxc:swit:conn:stat"])
def test_partial_forms_are_undefined_headers(device, header):
    assert device.handle_line(header) is None
    assert device.handle_line(":SYST:ERR?") == '-113,"Undefined header"'
    assert device.handle_line(":SYST:ERR?") == '0,"No error"'


def test_numeric_suffixes(device):
    assert device.handle_line(":READ2:CHAN3:POW?") == "2/3"
    assert device.handle_line(":read:chan:pow?") == "1/1"


def test_several_commands_on_one_line(device):
    assert device.handle_line("*IDN?;:bogus;:oxc:swit:conn:stat?") == "Vendor,Model,1,2;state"
    assert device.handle_line(":SYST:ERR:ALL?") == '-113,"Undefined header"'


def test_error_queue_is_bounded_and_says_it_overflowed(device):
    for _ in range(100):
        device.handle_line(":nonsense")
    reply = device.handle_line(":SYST:ERR:ALL?")
    assert reply.count("-113") == 29 and reply.endswith('-350,"Queue overflow"')
    assert device.handle_line("*CLS") is None
    assert device.handle_line(":SYST:ERR?") == '0,"No error"'


@pytest.mark.parametrize("text,ports", [("(@1,2,3)", [1, 2, 3]), ("(@)", []), ("( @5:7,9 )", [5, 6, 7, 9])])
def test_channel_lists(text, ports):
    assert parse_channel_list(text) == ports


@pytest.mark.parametrize("text", ["1,2", "(@a)", "(@3:1)", "(@1"])
def test_bad_channel_lists(text):
    with pytest.raises(ScpiError) as err:
        parse_channel_list(text)
    assert err.value.code == -104


def test_split_respects_parentheses_and_quotes():
    assert split_top_level('(@1,2),(@3,4)', ",") == ["(@1,2)", "(@3,4)"]
    assert split_top_level('A "x;y";B', ";") == ['A "x;y"', "B"]


def test_the_standard_event_status_register_by_error_class(device):
    """IEEE 488.2's ESR: PON at power-on, then each error class its own bit (a driver probing a
    feature with an undefined header reads command error, 32, never query error, 4)."""
    from lumion_hil.instruments.emulators.scpi_grammar import Number

    device.command(":SENSe:TIME", lambda a: Number(1e-4, 10.0, 1e-4, "S").parse(a) and None)
    assert device.handle_line("*ESR?") == "128" and device.handle_line("*ESR?") == "0"
    device.handle_line(":bogus")
    assert device.handle_line("*ESR?") == "32"
    device.handle_line(":SENS:TIME 20 S")  # out of range: an execution error
    assert device.handle_line("*ESR?") == "16"
    device.handle_line(":SENS:TIME 100 US")  # 1e-4 s, the minimum, with a multiplier: no error
    assert device.handle_line("*ESR?") == "0" and device.handle_line(":SYST:ERR?") == '-113,"Undefined header"'


def test_status_byte_follows_the_enable_masks_even_inside_a_compound_message(device):
    assert device.handle_line("*CLS;*ESE 60;*SRE 32;*ESE?;*SRE?") == "60;32"
    assert device.handle_line("*STB?") == "0"
    device.handle_line(":bogus")  # command error: ESR 32, enabled by *ESE 60: ESB, then MSS
    assert device.handle_line("*STB?") == str(4 + 32 + 64)
    device.handle_line("*CLS")
    assert device.handle_line("*STB?") == "0" and device.handle_line("*ESE?;*SRE?") == "60;32"
    device.handle_line("*ESE 0")
    device.handle_line(":bogus")
    assert device.handle_line("*STB?") == "4"  # the error is queued, but no enabled event
    device.handle_line("*ESE 256")
    assert device.handle_line(":SYST:ERR:ALL?").endswith('-222,"Data out of range"')
