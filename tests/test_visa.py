"""The VISA session under every SCPI driver: what it does when an exchange fails. In memory where
the dialogue shows it; on a loopback socket where only a socket can (an instrument that closes
the connection: the session learns it from the socket itself, by reading its end)."""

from __future__ import annotations

import pytest

from dialogue import DROP, DialogueServer, expect_dialogue
from lumion_hil.instruments.protocols import InstrumentIOError
from lumion_hil.instruments.visa import VisaSession


def in_memory(instrument) -> VisaSession:
    """The session alone, as the driver (it has close())."""
    return VisaSession("meter", "TCPIP0::meter.lab::5025::SOCKET", timeout_s=0.05, opener=instrument.open_resource)


def test_after_a_failed_exchange_the_next_command_goes_on_a_new_connection():
    """A late answer to the first question then arrives on the old connection, never as the
    answer to the second."""
    with expect_dialogue(in_memory, [("*IDN?", None), (":SENS1:POW:UNIT?", "+0")]) as visa:
        with pytest.raises(InstrumentIOError, match="timed out"):
            visa.query("*IDN?")
        assert visa.query(":SENS1:POW:UNIT?") == "+0"
        assert visa.reconnects == 1


def test_a_reply_that_is_not_text_is_an_error():
    with expect_dialogue(in_memory, [("*IDN?", b"\xff\xfe\n")]) as visa:
        with pytest.raises(InstrumentIOError, match=r"^meter: '\*IDN\?': reply is not text$"):
            visa.query("*IDN?")


def test_a_query_whose_connection_drops_is_asked_once_more_on_a_new_one():
    with DialogueServer([(":READ1:CHAN1:POW?", DROP), (":READ1:CHAN1:POW?", "-7.0E+001")]) as server:
        session = VisaSession("meter", server.resource, timeout_s=0.2)
        try:
            assert session.query(":READ1:CHAN1:POW?") == "-7.0E+001"
            assert session.reconnects == 1
        finally:
            session.close()
        server.check()
    assert server.connections == 2


def test_a_set_command_whose_connection_drops_is_an_error_and_is_not_sent_again():
    """Whether the instrument did it is unknown: the driver reads it back and decides."""
    with DialogueServer([(":SENS1:POW:UNIT 0;*OPC?", DROP), ("*IDN?", "Keysight Technologies,N7744A,MY1,1.0")]) \
            as server:
        session = VisaSession("meter", server.resource, timeout_s=0.2)
        try:
            with pytest.raises(InstrumentIOError, match=r"^meter: ':SENS1:POW:UNIT 0;\*OPC\?': no valid reply: the "
                                                        r"instrument closed the connection$"):
                session.query(":SENS1:POW:UNIT 0;*OPC?")
            assert session.query("*IDN?").startswith("Keysight")
        finally:
            session.close()
        server.check()
    assert server.connections == 2


def test_a_query_asked_again_after_a_drop_and_dropped_again_is_an_error():
    with DialogueServer([("*IDN?", DROP), ("*IDN?", DROP)]) as server:
        session = VisaSession("meter", server.resource, timeout_s=0.2)
        try:
            with pytest.raises(InstrumentIOError, match="the instrument closed the connection"):
                session.query("*IDN?")
        finally:
            session.close()
        server.check()
