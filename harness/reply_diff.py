"""Whether two replies to one request differ as behaviour, or only as timing: the tolerance of
numbers (powers in dB), what is never compared (identity, times, process ids), and the replies
a recording gave to the same request a moment earlier or later, or while the bench was changing.
Used by the replay (harness/transcript_replay.py) and the fidelity report (harness/fidelity.py)."""

from __future__ import annotations

import bisect
import math
import re
from typing import Any

from lumion_hil.harness.transcript_analysis import DARK_DBM, parse_number

# Replies that name the instrument or host rather than its behaviour: shown, never judged.
IDENTITY_COMMANDS = re.compile(r"^\*IDN\?|SYST(EM)?:SENS(OR)?:IDN\?|^ID\?", re.IGNORECASE)
IDENTITY_METHODS = {"hello", "devices"}
# Agent result fields that are times, process ids or echoes of the request: never compared.
UNCOMPARED_KEYS = {"pid", "t_ns", "started_ns", "exit_ns", "remote_ns", "argv", "hostname", "last_lines", "stdout",
                   "stderr", "uuid", "progress", "step_time_s", "samples_per_s", "heartbeat", "fields", "event",
                   "steps", "seconds", "elapsed_s", "returncode",
                   # whether a link was already up when its wait began: a matter of when it was asked
                   "already",
                   # a link's carrier counters count flaps over its whole history: whether a link
                   # locked before its light went again is a matter of a few ms at the lock time,
                   # judged by the link_up kinds below (a CI replay counted 11 changes where the
                   # recording had 9, with host2's bring-up matching within 0.1 ms)
                   "carrier_changes", "carrier_up_count", "carrier_down_count"}
POLL_METHODS = {"job_steps"}  # progress so far: one more or one fewer is a matter of when it was asked
# A meter's function state, polled until COMPLETE (FUNC:STAT? -> LOGGING_STABILITY,PROGRESS): the
# same function one poll further on or behind is a matter of when it was asked, and the logged
# block that follows is judged as a trace. A CI replay saw COMPLETE two polls (38 ms) sooner.
POLL_COMMANDS = re.compile(r":?SENS(?:e)?\d*:FUNC(?:tion)?:STAT(?:e)?\?$", re.IGNORECASE)

# Numbers inside replies (other than the power readings, which are judged per detector below) are
# the emulators' and the instruments' settings and states: the same within this.
POWER_TOLERANCE_DB = 0.3


# --- comparing replies -------------------------------------------------------------------------

def _numbers_equal(a: float, b: float, tol_db: float) -> bool:
    if a == b:
        return True
    if a > 0 and b > 0:
        if a < 1e-8 and b < 1e-8:  # both dark (below -50 dBm in watts)
            return True
        return abs(10 * math.log10(a / b)) <= tol_db
    if a <= -50 and b <= -50:  # both dark, in dBm
        return True
    return abs(a - b) <= tol_db


def _tokens(text: str) -> list[str]:
    return re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[A-Za-z_]+|[^\s\w]", text)


def differ(recorded: Any, replayed: Any, tol_db: float = POWER_TOLERANCE_DB) -> str | None:
    """Why two replies differ (None: they match within tolerance)."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(set(recorded) | set(replayed)):
            if key in UNCOMPARED_KEYS or key.endswith("_ns"):
                continue
            why = differ(recorded.get(key), replayed.get(key), tol_db)
            if why:
                return f"{key}: {why}"
        return None
    if isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            return f"{len(recorded)} items against {len(replayed)}"
        bad = [i for i, (a, b) in enumerate(zip(recorded, replayed)) if differ(a, b, tol_db)]
        if bad:
            return f"{len(bad)} of {len(recorded)} items differ (first: item {bad[0]}: " \
                   f"{differ(recorded[bad[0]], replayed[bad[0]], tol_db)})"
        return None
    if isinstance(recorded, bool) or isinstance(replayed, bool) or recorded is None or replayed is None:
        return None if recorded == replayed else f"{recorded!r} against {replayed!r}"
    if isinstance(recorded, (int, float)) and isinstance(replayed, (int, float)):
        return None if _numbers_equal(float(recorded), float(replayed), tol_db) else f"{recorded!r} against {replayed!r}"
    a, b = _tokens(str(recorded)), _tokens(str(replayed))
    if len(a) != len(b):
        return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
    for x, y in zip(a, b):
        nx, ny = parse_number(x), parse_number(y)
        if nx is not None and ny is not None:
            if not _numbers_equal(nx, ny, tol_db):
                return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
        elif x.upper() != y.upper():
            return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
    return None


SHIFT_WINDOW_NS = 25_000_000  # a reply the recording gave to the same request this close in time
TRACE_SHIFT = 0.2  # a trace (a logged block) whose samples differ only at a light edge, this fraction at most


def shifted_in_time(ordered: list[dict], starts: list[int], sent_at: list[int], index: int, replayed: Any) -> bool:
    """Whether a replayed reply is one the recording gave to the same command a little earlier
    or later (a poll that saw the light one poll sooner), or a trace whose light came a few
    samples sooner or later: a difference of timing, not of behaviour."""
    recorded = ordered[index].get("reply")
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed) and recorded:
        lit = [(_lit(a), _lit(b)) for a, b in zip(recorded, replayed)]
        edges = {i for i in range(1, len(lit)) for side in (0, 1) if lit[i][side] != lit[i - 1][side]}
        near_edge = {j for i in edges for j in (i - 1, i, i + 1)}
        mismatched = sum(x != y for x, y in lit)
        same_side_differ = any(differ(a, b) for i, ((x, y), a, b) in enumerate(zip(lit, recorded, replayed))
                               if x == y and i not in near_edge)
        return not same_side_differ and mismatched <= TRACE_SHIFT * len(recorded)
    key = "result" if ordered[index].get("type") == "agent" else "reply"
    t = ordered[index]["t_ns"]
    # ordered is in time order and sent_at in index order: the window's first sending by bisection
    lo = bisect.bisect_left(sent_at, bisect.bisect_left(starts, t - SHIFT_WINDOW_NS))
    window = []
    for j in sent_at[lo:]:
        if ordered[j]["t_ns"] > t + SHIFT_WINDOW_NS:
            break
        if j != index:
            window.append(ordered[j].get(key))
    if any(differ(reply, replayed) is None for reply in window):
        return True
    # a reading taken as the light came or went: between what the recording read around it
    value, numbers = parse_number(replayed), [parse_number(r) for r in window]
    around = [x for x in numbers if x is not None]
    return value is not None and len(around) >= 2 and min(around) <= value <= max(around)


def still_running(ordered: list[dict], by_index: dict, index: int) -> bool:
    """Whether the replay's last poll of the same instrument's function, before this exchange,
    answered that it was still running (``...,PROGRESS``): a result asked for then is refused on
    the replay only for a matter of timing."""
    name = ordered[index].get("name")
    for j in range(index - 1, max(-1, index - 200), -1):
        entry = ordered[j]
        if entry.get("name") == name and POLL_COMMANDS.match(str(entry.get("command") or "").strip()):
            reply = (by_index.get(j) or {}).get("reply")
            return isinstance(reply, str) and reply.strip().upper().endswith("PROGRESS")
    return False


def near_a_change(changes: list[tuple[int, int]], entry: dict) -> bool:
    """Whether a change of the bench (a fault made or undone, a switch command) was under way
    within SHIFT_WINDOW_NS of the exchange."""
    t, done = entry["t_ns"] - SHIFT_WINDOW_NS, entry.get("done_ns", entry["t_ns"]) + SHIFT_WINDOW_NS
    i = bisect.bisect_left(changes, (t - 60_000_000_000, 0))
    for start, end in changes[i:]:
        if start > done:
            return False
        if end >= t:
            return True
    return False


def _lit(value: Any) -> bool:
    """A sample that sees light: above -40 dBm, or above 0.1 uW where it is in watts."""
    x = parse_number(value)
    if x is None:
        return False
    return x > 1e-7 if 0 < x < 1 else x > DARK_DBM


