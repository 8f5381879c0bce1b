"""The dialogue helper fails a driver test on every kind of departure from the dialogue: a test
that could never fail would prove nothing."""

from __future__ import annotations

import time

import pytest

from dialogue import DialogueMismatch, expect_dialogue
from lumion_hil.instruments.protocols import InstrumentIOError
from lumion_hil.instruments.visa import VisaSession


def session(instrument, timeout_s: float = 0.05, write_termination: str = "\n") -> VisaSession:
    """A session alone is a driver too: it has close()."""
    return VisaSession("meter", "memory", timeout_s=timeout_s, write_termination=write_termination,
                       opener=instrument.open_resource)


def test_a_line_other_than_the_dialogues_fails_at_once_naming_the_step():
    with pytest.raises(DialogueMismatch, match=r"step 2: the driver sent 'B\?', the dialogue expects 'C\?'"):
        with expect_dialogue(session, [("A?", "1"), ("C?", "3")]) as visa:
            visa.query("A?")
            visa.query("B?")


def test_steps_left_unplayed_fail():
    with pytest.raises(DialogueMismatch, match=r"the driver stopped after 1 of 2 steps"):
        with expect_dialogue(session, [("A?", "1"), ("B?", "2")]) as visa:
            visa.query("A?")


def test_a_line_after_the_last_step_fails():
    with pytest.raises(DialogueMismatch, match=r"the driver sent 'B\?' after the dialogue's last step"):
        with expect_dialogue(session, [("A?", "1")]) as visa:
            visa.query("A?")
            visa.query("B?")


def test_a_reply_the_driver_never_reads_fails():
    with pytest.raises(DialogueMismatch, match=r"the driver sent 'B' before reading the reply to 'A'"):
        with expect_dialogue(session, [("A", "1"), ("B", None)]) as visa:
            visa.write("A")
            visa.write("B")
    with pytest.raises(DialogueMismatch, match=r"the reply to 'A' was never read"):
        with expect_dialogue(session, [("A", "1")]) as visa:
            visa.write("A")


def test_the_line_ending_is_part_of_the_dialogue():
    with pytest.raises(DialogueMismatch, match=r"the driver sent 'A\?\\r', the dialogue expects 'A\?'"):
        with expect_dialogue(lambda i: session(i, write_termination="\r\n"), [("A?", "1")]) as visa:
            visa.query("A?")


def test_silence_is_met_as_the_drivers_own_deadline():
    with expect_dialogue(lambda i: session(i, timeout_s=0.2), [("A?", None)]) as visa:
        started = time.monotonic()
        with pytest.raises(InstrumentIOError, match="timed out"):
            visa.query("A?")
        assert time.monotonic() - started >= 0.2


def test_a_mismatch_the_driver_swallows_still_fails_the_test():
    with pytest.raises(DialogueMismatch, match=r"step 1: the driver sent 'B\?'"):
        with expect_dialogue(session, [("A?", "1")]) as visa:
            try:
                visa.query("B?")
            except AssertionError:
                pass  # as a careless driver might
