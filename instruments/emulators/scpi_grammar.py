"""SCPI's grammar, for emulators: command patterns declared the way the vendors' programming
guides write them, matched by one parser for every spelling; the forms an argument takes; and
the standard's error numbers, which every refusal here raises.

Patterns follow SCPI-99 and the guides: ``[:SENSe[n]]:CORRection:WAVelength?``. Each node
matches its short form (the capitals) or its long form, in any case; a node in brackets may be
left out; ``[n]`` (or ``#``) after a node takes an optional numeric suffix, 1 when absent.
Arguments take MIN/MAX/DEF and units where declared (``1550NM``, ``-10DBM``, ``100MS``).
The device that holds a tree of such commands is :class:`~lumion_hil.instruments.emulators.scpi.ScpiDevice`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Literal


class ScpiError(Exception):
    """An error an emulated instrument puts on its error queue."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(f'{code},"{message}"')


COMMAND_ERROR = (-100, "Command error")
INVALID_CHARACTER = (-101, "Invalid character")
SYNTAX_ERROR = (-102, "Syntax error")
DATA_TYPE_ERROR = (-104, "Data type error")
PARAMETER_NOT_ALLOWED = (-108, "Parameter not allowed")
MISSING_PARAMETER = (-109, "Missing parameter")
UNDEFINED_HEADER = (-113, "Undefined header")
HEADER_SUFFIX_OUT_OF_RANGE = (-114, "Header suffix out of range")
INVALID_SUFFIX = (-131, "Invalid suffix")
ILLEGAL_PARAMETER = (-224, "Illegal parameter value")
EXECUTION_ERROR = (-200, "Execution error")
SETTINGS_CONFLICT = (-221, "Settings conflict")
DATA_OUT_OF_RANGE = (-222, "Data out of range")
DATA_STALE = (-230, "Data corrupt or stale")
HARDWARE_MISSING = (-241, "Hardware missing")
DEVICE_ERROR = (-300, "Device-specific error")
QUEUE_OVERFLOW = (-350, "Queue overflow")


@dataclass
class _Node:
    short: str
    long: str
    suffix: bool = False

    def match(self, name: str, digits: str) -> tuple[bool, int | None]:
        if name.upper() not in (self.short, self.long):
            return False, None
        if digits and not self.suffix:
            return False, None
        return True, (int(digits) if digits else 1) if self.suffix else None


@dataclass
class _Optional:
    items: list


Handler = Callable[..., "str | bytes | None"]


@dataclass
class Command:
    """A declared command: its compiled pattern, whether it is a query, and its handler."""

    items: list
    query: bool
    handler: Handler
    pattern: str
    suffixes: int = 0


def _node(word: str, suffix: bool) -> _Node:
    short = "".join(ch for ch in word if ch.isupper() or ch.isdigit() or ch in "*") or word.upper()
    return _Node(short, word.upper(), suffix)


def compile_pattern(pattern: str) -> tuple[list, bool, int]:
    """``[:SENSe[n]]:POWer[:DC]:UNIT?`` -> (items, is_query, number of suffix nodes)."""
    text = pattern.strip()
    query = text.endswith("?")
    text = text.rstrip("?")
    pos = 0
    count = 0

    def group(end: str | None) -> list:
        nonlocal pos, count
        items: list = []
        while pos < len(text):
            ch = text[pos]
            if end and ch == end:
                pos += 1
                return items
            if ch == "[":
                pos += 1
                items.append(_Optional(group("]")))
                continue
            if ch == ":":
                pos += 1
                continue
            m = re.compile(r"([A-Za-z*][A-Za-z0-9_*]*?)(\[n\]|\[m\]|<n>|<m>|#)?(?=[:\[\]]|$)").match(text, pos)
            if not m:
                raise ValueError(f"bad SCPI pattern {pattern!r} at {pos}")
            word, marker = m.group(1), m.group(2)
            items.append(_node(word, bool(marker)))
            count += bool(marker)
            pos = m.end()
        if end:
            raise ValueError(f"bad SCPI pattern {pattern!r}: unclosed [")
        return items

    items = group(None)
    return items, query, count


def match_tokens(items: list, tokens: list[tuple[str, str]], suffixes: list) -> list | None:
    """Suffix values for every suffix node (skipped ones: 1) if the tokens match, else None."""
    if not items:
        return suffixes if not tokens else None
    head, rest = items[0], items[1:]
    if isinstance(head, _Optional):
        taken = match_tokens(head.items + rest, tokens, suffixes)
        if taken is not None:
            return taken
        return match_tokens(rest, tokens, suffixes + [1] * _suffix_nodes(head.items))
    if not tokens:
        return None
    ok, number = head.match(*tokens[0])
    if not ok:
        return None
    return match_tokens(rest, tokens[1:], suffixes + ([number] if head.suffix else []))


def _suffix_nodes(items: list) -> int:
    return sum(_suffix_nodes(i.items) if isinstance(i, _Optional) else int(i.suffix) for i in items)


# one node of a header: a node may hold digits (Q4Voltage); trailing ones are its suffix
HEADER_TOKEN = re.compile(r"([A-Za-z*][A-Za-z0-9*]*?)(\d*)")


def split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside parentheses and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def parse_channel_list(text: str) -> list[int]:
    """``(@1,2,5:7)`` -> [1, 2, 5, 6, 7]; ``(@)`` -> []."""
    m = re.fullmatch(r"\s*\(\s*@([^)]*)\)\s*", text)
    if not m:
        raise ScpiError(*DATA_TYPE_ERROR)
    out: list[int] = []
    for item in filter(None, (s.strip() for s in m.group(1).split(","))):
        if ":" in item:
            lo, hi = item.split(":", 1)
            if not (lo.strip().isdigit() and hi.strip().isdigit()) or int(lo) > int(hi):
                raise ScpiError(*DATA_TYPE_ERROR)
            out.extend(range(int(lo), int(hi) + 1))
        elif item.isdigit():
            out.append(int(item))
        else:
            raise ScpiError(*DATA_TYPE_ERROR)
    return out


def ieee_block(payload: bytes) -> bytes:
    """IEEE 488.2 definite-length block: #<digits><length><payload>."""
    length = str(len(payload))
    return f"#{len(length)}{length}".encode("ascii") + payload


_MULTIPLIERS = {"": 1.0, "EX": 1e18, "PE": 1e15, "T": 1e12, "G": 1e9, "MA": 1e6, "K": 1e3, "M": 1e-3, "U": 1e-6,
                "N": 1e-9, "P": 1e-12, "F": 1e-15, "A": 1e-18}
_KEYWORDS = {"MIN": "MIN", "MINIMUM": "MIN", "MAX": "MAX", "MAXIMUM": "MAX", "DEF": "DEF", "DEFAULT": "DEF"}


def parse_number(text: str, unit: str = "", *, units: dict[str, float] | None = None) -> float:
    """A numeric argument with an optional SCPI multiplier and unit: ``1550nm``, ``100 MS``,
    ``1e-4s``, ``-10DBM``. ``unit`` is the base unit (``M`` metres, ``S`` seconds, ``W``);
    ``units`` maps other whole suffixes to factors (``{"NM": 1}`` for a value kept in nm)."""
    m = re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ScpiError(*DATA_TYPE_ERROR)
    value, suffix = float(m.group(1)), m.group(2).upper()
    if not suffix:
        return value
    if units and suffix in units:
        return value * units[suffix]
    if unit and suffix.endswith(unit.upper()):
        prefix = suffix[: -len(unit)]
        if prefix in _MULTIPLIERS:
            return value * _MULTIPLIERS[prefix]
    raise ScpiError(*INVALID_SUFFIX)


def keyword(text: str) -> str | None:
    """MIN, MAX or DEF (any spelling SCPI allows), or None."""
    return _KEYWORDS.get(text.strip().upper())


@dataclass
class Number:
    """A numeric setting the way SCPI declares one: its range, default, unit and the reply
    format; MIN/MAX/DEF work on the setting and on its query."""

    minimum: float
    maximum: float
    default: float
    unit: str = ""
    units: dict[str, float] = field(default_factory=dict)
    integer: bool = False

    def parse(self, args: str) -> float:
        if not args.strip():
            raise ScpiError(*MISSING_PARAMETER)
        word = keyword(args)
        if word:
            return {"MIN": self.minimum, "MAX": self.maximum, "DEF": self.default}[word]
        value = parse_number(args, self.unit, units=self.units)
        if self.integer:
            if value != int(value):
                raise ScpiError(*DATA_TYPE_ERROR)
            value = int(value)
        # A limit written with a multiplier (100 US for 1e-4 s) is the limit: the multiplication's
        # last bit of rounding does not put it out of range.
        for limit in (self.minimum, self.maximum):
            if math.isclose(value, limit, rel_tol=1e-9, abs_tol=0.0):
                value = limit
        if not self.minimum <= value <= self.maximum:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return value

    def query(self, args: str, current: float) -> float:
        """The query's answer: the current value, or MIN/MAX/DEF when asked for."""
        if not args.strip():
            return current
        word = keyword(args)
        if word is None:
            raise ScpiError(*ILLEGAL_PARAMETER)
        return {"MIN": self.minimum, "MAX": self.maximum, "DEF": self.default}[word]


def boolean(args: str) -> bool:
    value = args.strip().upper()
    if not value:
        raise ScpiError(*MISSING_PARAMETER)
    if value in ("ON", "1"):
        return True
    if value in ("OFF", "0"):
        return False
    raise ScpiError(*ILLEGAL_PARAMETER)


def choice(args: str, *options: str) -> str:
    """One of the declared words (each in its short or long form), as declared."""
    value = args.strip().upper()
    if not value:
        raise ScpiError(*MISSING_PARAMETER)
    for option in options:
        node = _node(option, False)
        if value in (node.short, node.long):
            return option
    raise ScpiError(*ILLEGAL_PARAMETER)


def no_args(args: str) -> Literal[False]:
    """Refuse arguments; False otherwise, so that a query reads ``no_args(a) or reply``."""
    if args.strip():
        raise ScpiError(*PARAMETER_NOT_ALLOWED)
    return False


def format_channel_list(ports) -> str:
    return "(@" + ",".join(str(p) for p in ports) + ")"
