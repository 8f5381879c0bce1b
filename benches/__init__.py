"""The bench files shipped with lumion-hil, installed as package data (``lumion_hil.benches``),
so a wheel install runs the default emulated bench from anywhere."""

from importlib.resources import files
from pathlib import Path


def bench_file(name: str = "emulated.yaml") -> Path:
    """The path of a shipped bench file (``emulated.yaml``: the default emulated bench)."""
    return Path(str(files(__name__) / name))
