"""Each emulated model's command set as its vendor's programming reference writes it, as data
(``manuals/<model>.yaml``), and the conformance table generated from it.

A manual file transcribes every command of the reference: its pattern as the manual writes it
(``[:SENSe]:CORRection:WAVelength``), its parameters, unit, range and default, and its state
here: ``implemented`` (the emulator does what the manual says) or ``refused`` (the emulator
answers with an error, and ``reason`` says why and names it: no such hardware on the emulated
bench (-241), a setting the bench must not change (-221)...). The project's tests send every
implemented command in its long and its short form to the emulator, see that every refused one
is answered with the error its reason names, and that every command the emulator declares is
in its manual.

``python -m lumion_hil.instruments.emulators.conformance`` prints the table (Markdown);
``--write docs/conformance.md`` writes it (a test checks that the file is current).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lumion_hil.instruments import registry

MANUALS = Path(__file__).with_name("manuals")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Command(_Model):
    """One command of the manual. ``command`` is the header as the manual writes it (a query
    ends in ``?``; set and query forms are separate entries)."""

    command: str
    parameters: str = Field("", description="the parameters as the manual writes them")
    unit: str = ""
    range: str = ""
    default: str = ""
    section: str = Field("", description="where in the manual (section or page)")
    state: Literal["implemented", "refused"]
    reason: str = Field("", description="why the emulator refuses it (refused only)")
    send: str = Field("", description="the arguments the test sends with it, if it takes any")
    expect_error: int | None = Field(None, description="the error an implemented command rightly gives with "
                                     "'send' on a fresh emulator (a FETCh? before any INITiate: -230)")
    checked: str = Field("", description="a second reference this entry was checked against: where, and what was "
                         "found (as emulated, or how it differs and which reading the emulator follows)")
    answers: bool | None = Field(None, description="whether the instrument replies to it, as its reference says; "
                                 "unset: a query answers and a command does not (see Manual.answers)")

    @model_validator(mode="after")
    def _reason_for_refused(self):
        if self.state == "refused" and self.refused_with is None:
            raise ValueError(f"{self.command}: a refused command says why, naming the error it answers "
                             "(reason: '... (-241)')")
        return self

    @property
    def refused_with(self) -> int | None:
        """The error number a refused command answers with, as its reason names it."""
        m = re.search(r"(-\d{3})\b", self.reason)
        return int(m.group(1)) if m else None


class Manual(_Model):
    model: str
    title: str = Field(description="the manual's title, edition and date")
    sources: list[str] = Field(min_length=1, description="where it was read")
    syntax: Literal["scpi", "literal"] = Field("scpi", description="scpi: long and short forms, optional nodes; "
                                               "literal: the command is sent as written")
    error_query: str = "SYST:ERR?"
    no_error: str = Field(description="the error query's reply on an empty queue")
    identity_query: str = Field("*IDN?", description="the query that names the instrument")
    notes: str = ""
    commands: list[Command] = Field(min_length=1)

    def answers(self, command: Command) -> bool:
        """Whether the instrument sends a reply to ``command`` (sent with its ``send``): what the
        entry says, else a query answers (a header ending in ``?``; in a literal protocol a
        ``?`` anywhere in it) and a command does not. A refused command, or one sent where it
        rightly fails (``expect_error``), answers nothing: its error goes on the queue. A client
        that reads a reply the instrument does not send, or leaves one unread, reads every reply
        after it one query late."""
        if command.answers is not None:
            return command.answers
        if command.state == "refused" or command.expect_error is not None:
            return False
        if self.syntax == "literal":
            return "?" in command.command
        return command.command.rstrip().endswith("?")


def manual_path(model: str) -> Path:
    """Where a model's manual is: as its registry entry says (a plug-in's travels with it), else
    ``manuals/<model>.yaml`` here."""
    entry = registry.find(model)
    return (entry.manual_path() if entry else None) or MANUALS / f"{model}.yaml"


def load(model: str) -> Manual:
    path = manual_path(model)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return Manual.model_validate(data)
    except Exception as exc:
        raise ValueError(f"{path}: {exc}") from None


def available() -> list[str]:
    """The registered models that have a manual, in the registry's order."""
    return [m.name for m in registry.models() if m.manual and manual_path(m.name).exists()]


# --- long and short forms ------------------------------------------------------------------------

_WORD = re.compile(r"([A-Za-z*][A-Za-z0-9_*]*?)(\[n\]|\[m\]|<n>|<m>|#)?(?=[:\[\]?]|$)")


def forms(pattern: str, suffix: int = 1) -> tuple[str, str]:
    """(long, short) spellings of a SCPI header pattern: the long form with every optional node
    and its suffixes written out, the short form with only the required nodes, abbreviated.
    ``[:SENSe[n]]:POWer[:DC]:UNIT?`` -> (``:SENSE1:POWER:DC:UNIT?``, ``:POW:UNIT?``)."""
    text = pattern.strip()
    query = text.endswith("?")
    text = text.rstrip("?")
    if text.startswith("*"):
        return (text + "?" * query,) * 2
    long_parts: list[str] = []
    short_parts: list[str] = []
    depth = 0
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch == "[":
            # a numeric-suffix marker "[n]" is not an optional node
            if text[pos:pos + 3] in ("[n]", "[m]"):
                pos += 3
                continue
            depth += 1
            pos += 1
            continue
        if ch == "]":
            depth -= 1
            pos += 1
            continue
        if ch == ":":
            pos += 1
            continue
        m = _WORD.match(text, pos)
        if not m:
            raise ValueError(f"bad SCPI pattern {pattern!r} at {pos}")
        word, marker = m.group(1), m.group(2)
        short = "".join(c for c in word if c.isupper() or c.isdigit()) or word.upper()
        digits = str(suffix) if marker else ""
        long_parts.append(word.upper() + digits)
        if depth == 0:
            short_parts.append(short + digits)
        pos = m.end()
    tail = "?" if query else ""
    return ":" + ":".join(long_parts) + tail, (":" + ":".join(short_parts) + tail) if short_parts else ""


def spellings(manual: Manual, command: Command) -> list[str]:
    """The header spellings the test sends: long and short for SCPI, the command as written
    for a literal protocol."""
    if manual.syntax == "literal":
        return [command.command]
    long, short = forms(command.command)
    return [long] if long == short else [long, short]


# --- the table -------------------------------------------------------------------------------------

def table(manual: Manual) -> str:
    implemented = sum(c.state == "implemented" for c in manual.commands)
    lines = [
        f"### {manual.model}: {manual.title}",
        "",
        f"{len(manual.commands)} commands: {implemented} implemented, {len(manual.commands) - implemented} refused. "
        f"Read from: {'; '.join(manual.sources)}.",
        "",
    ]
    if manual.notes:
        lines += [manual.notes.strip(), ""]
    checked = any(c.checked for c in manual.commands)
    header = ["command", "parameters", "unit", "range", "default", "answers", "state"] + ["checked against"] * checked
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in manual.commands:
        state = "implemented" if c.state == "implemented" else f"refused: {c.reason}"
        cells = [f"`{c.command}`", c.parameters, c.unit, c.range, c.default, "yes" if manual.answers(c) else "no", state]
        cells += [c.checked] * checked
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def document() -> str:
    parts = [
        "# Conformance of the emulated instruments",
        "",
        "Generated from `instruments/emulators/manuals/*.yaml` by "
        "`python -m lumion_hil.instruments.emulators.conformance --write docs/conformance.md`; "
        "do not edit by hand. Every command of each model's programming reference, and what the "
        "emulator does with it. `tests/test_conformance.py` sends every implemented command in "
        "its long and its short form, checks that every refused one is answered with an error, "
        "and that every command an emulator declares is in its manual; over the transport the "
        "instrument is served on, it sends every command followed by the identity query and reads "
        "the identity back every time (the `answers` column says which commands reply: one "
        "answered where the table says no, or silent where it says yes, puts a client's every "
        "later read one reply out of step).",
        "",
    ]
    for model in available():
        parts.append(table(load(model)))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lumion_hil.instruments.emulators.conformance",
                                     description="The emulated instruments' conformance table, from their manuals.")
    parser.add_argument("--write", metavar="FILE", help="write the table to FILE instead of printing it")
    args = parser.parse_args(argv)
    try:
        text = document()
    except ValueError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
