"""A command's hold on its bench's labgrid place (harness/places.py), as ``lumion-hil run`` and
the bench commands take it: reserved, waited for, acquired, and released at the end whatever the
end, each step said on the terminal; busy is exit status 6, a place that cannot be used 4."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import click

from lumion_hil.exits import fail
from lumion_hil.harness.config import Bench, port_ranges
from lumion_hil.harness.exit_codes import ExitCode


@contextlib.contextmanager
def holding_place(bench: Bench, wait_s: float | None) -> Iterator[dict[str, str]]:
    """For a bench that is a labgrid place: reserve, wait for (``wait_s``) and acquire it, and
    release it at the end whatever happens. Yields the environment that tells the suites what
    the place gives (empty for a bench without one). Busy: exit 6; a bad place: exit 4."""
    from lumion_hil.harness.places import PLACE_ENV, PlaceBusy, PlaceError, hold, place_spec, wanted_from_place

    spec = place_spec(bench)
    if spec is None:
        yield {}
        return
    try:
        place, info = hold(spec, wanted_from_place(bench), wait_s,
                           lambda text: click.echo(f"lumion-hil: {text}", err=True))
    except PlaceBusy as exc:
        fail(f"bench busy: {exc}", ExitCode.BENCH_BUSY)
    except PlaceError as exc:
        fail(str(exc))
    click.echo(f"lumion-hil: acquired {spec.describe().replace(repr(spec.name), repr(info['place']), 1)} as "
               f"{info['acquired_by']}" + (f", switch ports {port_ranges(info['ports'])}" if info["ports"] else ""))
    try:
        yield {PLACE_ENV: json.dumps(info)}
    finally:
        try:
            place.release()
            click.echo(f"lumion-hil: released place {info['place']!r}")
        except PlaceError as exc:
            click.echo(f"lumion-hil: could not release place {info['place']!r}: {exc}; `lumion-hil bench release` "
                       "releases it", err=True)
        finally:
            place.close()
