"""The one way time is scaled. An emulated bench may run its physics at a time scale (0.1: ten
times faster); every latency, deadline and published time limit on it is scaled the same way,
and says so. Deadlines add a real-time I/O allowance, since a command's round trip does not
shrink with the emulation. Software time (the controller's own) is never scaled: a published time that a
controller's software is part of gets the bench's software budget added, unscaled, and the
software is judged on its own, in absolute terms (``controller_overhead_total``)."""

from __future__ import annotations


def scaled(seconds: float, scale: float, allowance_s: float = 0.0, allowance: str = "I/O allowance") -> tuple[float, str]:
    """``seconds`` at time scale ``scale`` (plus ``allowance_s`` of real time when scaled: the
    part that does not shrink with the emulation, named by ``allowance``), and the note that
    says how ("" at scale 1, where nothing changes)."""
    if scale == 1.0:
        return seconds, ""
    allowance = f" + {allowance_s:g} s {allowance}" if allowance_s else ""
    return seconds * scale + allowance_s, f"x time scale {scale:g}{allowance} (emulated latencies scaled alike)"
