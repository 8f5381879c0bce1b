"""The options several commands take: the bench file (``--bench``), the emulated bench's time
scale (``--time-scale``) and its defects (``--defect``)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from lumion_hil.benches import bench_file

DEFAULT_BENCH = bench_file("emulated.yaml")

bench_option = click.option(
    "--bench", "bench_path", type=click.Path(dir_okay=False, path_type=Path),
    default=lambda: os.environ.get("LUMION_HIL_BENCH", str(DEFAULT_BENCH)), show_default="benches/emulated.yaml",
    help="Bench file (env LUMION_HIL_BENCH).")
scale_option = click.option(
    "--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Multiply every emulated latency by this factor (0.1 runs ten times faster).")
defect_option = click.option(
    "--defect", "defects", multiple=True, metavar="NAME[=VALUE]",
    help="A defect of the emulated bench or the controller (repeatable); `lumion-hil defects` lists them.")
