"""JSON lines, one message a line, for the agent's stdin/stdout and the emulated world service.

Request: ``{"id": 7, "method": "health", "params": {...}}``. Reply: ``{"id": 7, "ok": true,
"result": ..., "clock_ns": <the answering side's monotonic clock>}`` or ``{"id": 7, "ok": false,
"error": {"type": "...", "message": "..."}}``.
"""

from __future__ import annotations

import json
from typing import Any


class RemoteError(Exception):
    def __init__(self, where: str, method: str, kind: str, message: str):
        self.where, self.method, self.kind = where, method, kind
        super().__init__(f"{where}: {method}: {kind}: {message}")


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message is a JSON object")
    return message
