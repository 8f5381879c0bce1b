"""The ``lumion-hil bench`` commands: check bench files and export their schema, put a bench back
at its baseline or release its labgrid place after a killed run, and commission a bench
(discover, wiring, budget: thin wrappers over harness/commissioning/)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import click

from lumion_hil.cli_options import bench_option, defect_option, scale_option
from lumion_hil.exits import fail, load_or_exit, stopping_safely
from lumion_hil.harness.config import bench_json_schema, load_bench
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.harness.exit_codes import ExitCode
from lumion_hil.place_holding import holding_place


@click.group()
def bench() -> None:
    """Check bench files and export their schema; commission a bench: discover, wiring, budget."""


@bench.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def bench_check(files: tuple[Path, ...]) -> None:
    """Validate bench files: every problem with its field, line and reason. Exit 1 if any is bad."""
    bad = 0
    for file in files:
        try:
            b = load_bench(file)
        except BenchFileError as exc:
            click.echo(str(exc), err=True)
            bad += 1
            continue
        emulated = sum(1 for i in b.instruments.values() if i.emulated)
        click.echo(f"{file}: ok: bench {b.name!r}, {len(b.instruments)} instrument(s) ({emulated} emulated), "
                   f"{len(b.topology.hosts)} host(s), {len(b.detectors)} detector(s), "
                   f"{len(b.safety.baseline)} baseline cross-connect(s)")
    sys.exit(1 if bad else 0)


@bench.command("restore")
@bench_option
def bench_restore(bench_path: Path) -> None:
    """Put a bench's switch back to its baseline cross-connects and read it back (after a run
    that was killed). Takes the bench's lock (or its labgrid place) like a run; protected ports,
    and on a shared switch the other benches' ports, are left as they are."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.session import BenchSession

    bench = load_or_exit(bench_path, None)
    from lumion_hil.harness.backends import backend_name

    if backend_name(bench) == "netns":  # the rack in a box: what a run killed outright left behind
        from lumion_hil.instruments.emulators.rack import Rack

        # A run whose wrapper was killed is still stopping at a safe point: wait for it as a run's
        # own Ctrl-C is waited for (twice the OPC deadline and 30 s), then remove what is left.
        removed, left = Rack.restore_after_killed_runs(wait_s=2 * bench.deadlines.opc_s + 30)
        click.echo(f"bench {bench.name!r}: " + (f"removed {', '.join(removed)}" if removed
                                                else "no rack left behind by a run that ended without tearing it down"))
        if any(left.values()):
            fail(f"bench {bench.name!r} is not restored: still on this machine, owned by no live run: "
                 + "; ".join(f"{kind}: {', '.join(names)}" for kind, names in left.items() if names))
        running = Rack.leftovers()
        if any(running.values()):
            click.echo(f"lumion-hil: racks of runs still going (left as they are): {running['netns']}", err=True)
        return
    if bench.all_emulated:
        raise click.ClickException(f"bench {bench.name!r} is emulated in-process: there is nothing to restore")
    try:
        with holding_place(bench, None) as place_env:  # a labgrid place: held like a run holds it
            if place_env:
                os.environ.update(place_env)
                bench = load_or_exit(bench_path, None)  # with the place's addresses and ports
            with BenchSession.open(bench, restore=False) as session:
                if session.switch is None:
                    raise HarnessError(f"bench {bench.name!r} has no optical switch to restore")
                session.restore_baseline(verify=True)
                click.echo(f"{session.switch.name}: at its baseline ({len(bench.safety.baseline)} cross-connects)")
    except BenchInUseError as exc:
        fail(str(exc), ExitCode.BENCH_BUSY)
    except HarnessError as exc:
        fail(str(exc))


@bench.command("release")
@bench_option
@click.option("--force", is_flag=True, help="Release it even where lumion-hil cannot tell that its holder is gone "
                                            "(a run on another machine, or not a lumion-hil run).")
def bench_release(bench_path: Path, force: bool) -> None:
    """Release a bench's labgrid place that a run left acquired (a run killed outright), and
    cancel the reservation it held; says who held it. Nothing else is taken over: a place held
    by a live run on this machine is never released here, and one held from another machine (or
    not by a lumion-hil run) only with --force."""
    from lumion_hil.harness.places import LabgridPlace, PlaceError, place_spec

    bench = load_or_exit(bench_path, None)
    spec = place_spec(bench)
    if spec is None or spec.name is None:
        raise click.ClickException(f"bench {bench.name!r} names no labgrid place (a place: section with a name, or "
                                   "LG_PLACE): its lock is a file on this machine, freed when its run ends")
    place = LabgridPlace(spec)
    try:
        holder = place.holder()
        if not holder.acquired_by:
            click.echo(f"{spec.describe()}: not acquired; nothing to release")
            return
        if holder.stale is False:
            raise click.ClickException(f"{spec.describe()} is held by a run that is still going: {holder.describe()}")
        if holder.stale is None and not force:
            raise click.ClickException(f"{spec.describe()} is held by {holder.describe()}: from here lumion-hil cannot "
                                       "tell whether that holder is gone; ask them, or release it with --force")
        place.release_stale()
        click.echo(f"{spec.describe()}: released; it was acquired by {holder.acquired_by}"
                   + (f" ({holder.comment})" if holder.comment else ""))
    except PlaceError as exc:
        fail(str(exc))
    finally:
        place.close()


# --- bench: commissioning (discover, wiring, budget) -------------------------------------------
# Thin wrappers: the work is in harness/commissioning/. Each opens the bench as a run does (its
# lock or labgrid place held, the switch guarded) and restores the baseline on every exit.


@contextlib.contextmanager
def _commissioning(bench, bench_path: Path, time_scale: float | None, defects: tuple):
    """The bench open for a walk, as a run opens it (its lock or labgrid place held), stopping
    safely: yields the session, whose closing restores the baseline whatever the exit."""
    from lumion_hil.harness.session import BenchSession

    with stopping_safely("the switch is back at its baseline and every transmitter on"):
        with holding_place(bench, None) as place_env:
            if place_env:
                os.environ.update(place_env)
                bench = load_or_exit(bench_path, time_scale, defects)  # with the place's addresses and ports
            with BenchSession.open(bench) as session:
                yield session


def _progress(line: str) -> None:
    click.echo(f"  {line}")


@bench.command("discover")
@click.option("-i", "--instrument", "resources", multiple=True, metavar="RESOURCE",
              help="An instrument's address: a VISA resource (TCPIP0::10.0.0.5::5025::SOCKET, USB0::...), a serial "
                   "device (/dev/ttyUSB0) or socket://HOST:PORT (repeatable).")
@click.option("--scan/--no-scan", default=True, show_default=True,
              help="Also try every resource pyvisa-py lists on this machine (serial ports, USB, VXI-11).")
@click.option("-H", "--host", "hosts", multiple=True, metavar="[NAME=]ADDRESS",
              help="A GPU host: an ssh destination (lab@gpu3.lab), `local`, or an emulated bench's world:HOST:PORT "
                   "(repeatable).")
@click.option("--python", default="python3", show_default=True, help="The interpreter that runs the hosts' agents.")
@click.option("--protect", default="", metavar="PORTS",
              help="Switch ports never to touch (another experiment's light), e.g. 16,32 or 1-4.")
@click.option("--interfaces", default="*", show_default=True, metavar="GLOB",
              help="Which of the hosts' interfaces are optical NICs on the switch (e.g. 'ens1f*').")
@click.option("--name", default="drafted-bench", show_default=True, help="The bench's name (its lock is named so).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the drafted bench file.")
def bench_discover(resources: tuple[str, ...], scan: bool, hosts: tuple[str, ...], python: str, protect: str,
                   interfaces: str, name: str, output: Path) -> None:
    """Find the instruments and hosts on the desk, walk the fibres, and draft a bench file.

    Each instrument is identified by its own identity query, with its size or channels read
    from it; each host's GPUs and interfaces are read through its agent; then every interface's
    transmitter is turned off and on while the switch's monitors watch, and lit ports are
    connected one at a time while the hosts watch for carrier. The switch is put back as it was
    found. In the draft, every value says how it was obtained: read, measured, given, or an
    assumption to replace.

    \b
    Exit status: 0 drafted, 4 nothing usable answered (or a bad option), 6 bench busy,
    2 interrupted (the switch put back)."""
    from lumion_hil.harness.commissioning.discover import discover, summary
    from lumion_hil.harness.places import PlaceError, parse_ports

    try:
        protected = parse_ports(protect)
    except PlaceError as exc:
        raise click.BadParameter(str(exc).replace("ports tag", "ports"), param_hint="--protect") from None
    if not hosts:
        raise click.BadParameter("name at least one GPU host", param_hint="--host")
    with stopping_safely("the switch was put back as it was found"):
        text, found = discover(list(resources), list(hosts), scan=scan, python=python, protected=protected,
                               interfaces=interfaces, name=name, log=_progress)
    output.write_text(text, encoding="utf-8")
    for line in summary(found):
        click.echo(f"lumion-hil: {line}")
    click.echo(f"lumion-hil: drafted {output}; check it with `lumion-hil bench check {output}`")


@bench.command("wiring")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@scale_option
@defect_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the bench file with the patch applied here.")
def bench_wiring(file: Path, time_scale: float | None, defects: tuple[str, ...], output: Path | None) -> None:
    """Find where every NIC's fibres land on the switch and compare with FILE.

    Each transmitter is turned off and on through its host's agent while the switch's monitors
    watch the ingress ports; then one lit ingress at a time is connected to each candidate egress
    port while the hosts watch for carrier (and the meters for light: their taps). Protected
    ports, and on a shared switch the other benches' ports, are never commanded; the baseline is
    restored at the end, also after Ctrl-C. Prints every difference ("host1.p0 transmits into
    port 4; the bench file says 3") and a patch for FILE.

    \b
    Exit status: 0 the bench file is right, 1 it differs (the patch is printed), 2 interrupted,
    4 bench or instrument error, 6 bench busy."""
    from lumion_hil.harness.commissioning.walk import find_fibres, nics_of
    from lumion_hil.harness.commissioning.wiring import compare, patched_text, unified_diff

    bench = load_or_exit(file, time_scale, defects)
    click.echo(f"lumion-hil: walking the fibres of bench {bench.name!r} ({file}): {len(bench.nic_ports())} NIC "
               f"port(s) on {bench.topology.switch}")
    with _commissioning(bench, file, time_scale, defects) as session:
        found = find_fibres(session, nics_of(bench), log=_progress)
    differences = compare(bench, found)
    click.echo(f"lumion-hil: walk {found.duration_s:.2f} s, {len(found.switching_s)} test circuit(s); baseline "
               "restored")
    if not differences:
        click.echo(f"lumion-hil: {file}: every fibre is where the bench file says")
        return
    click.echo(f"lumion-hil: {len(differences)} difference(s) from {file}:")
    for diff in differences:
        click.echo(f"  {diff.text}")
    text = file.read_text(encoding="utf-8")
    patched = patched_text(text, differences)
    if patched != text:
        click.echo(unified_diff(text, patched, file.name), nl=False)
        if output is not None:
            output.write_text(patched, encoding="utf-8")
            click.echo(f"lumion-hil: wrote the patched bench file {output}")
    sys.exit(ExitCode.TESTS_FAILED)


@bench.command("budget")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@scale_option
@defect_option
@click.option("--readings", type=click.IntRange(min=2), default=5, show_default=True,
              help="Readings of each port per circuit (their spread sets each figure's interval).")
@click.option("--tolerance-db", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="How far a transmitter, port or path may be from what it should be before it is named.")
@click.option("--all", "show_all", is_flag=True, help="Print every circuit (default: the 12 worst).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write every circuit and finding as JSON here.")
def bench_budget(file: Path, time_scale: float | None, defects: tuple[str, ...], readings: int, tolerance_db: float,
                 show_all: bool, json_out: Path | None) -> None:
    """Measure the light budget of every circuit FILE's topology can make: the light at the
    switch input, the switch's loss on the path, the light at the receiver and its margin over
    the receivers' sensitivity, worst first. The light each transmitter should give (launch_dbm
    less tx_fibre_loss_db) and each meter tap's loss are compared with what was measured, and a
    port whose every path loses more than the others (a dirty connector) is named.

    \b
    Exit status: 0 every circuit above sensitivity plus margin and nothing named, 1 otherwise,
    2 interrupted, 4 bench or instrument error, 6 bench busy."""
    import dataclasses

    from lumion_hil.harness.commissioning.budget import measure_budget

    bench = load_or_exit(file, time_scale, defects)
    click.echo(f"lumion-hil: measuring the light budget of bench {bench.name!r} ({file})")
    with _commissioning(bench, file, time_scale, defects) as session:
        budget = measure_budget(session, readings=readings, tolerance_db=tolerance_db, log=_progress)
    click.echo(f"lumion-hil: {len(budget.paths)} circuit(s) in {budget.duration_s:.2f} s; baseline restored. "
               f"Receivers' sensitivity {budget.sensitivity_dbm:g} dBm, with the link margin {budget.floor_dbm:g} dBm"
               + (f"; the switch's loss shared by every path {budget.shared_loss_db:.2f} dB"
                  if budget.shared_loss_db is not None else ""))
    click.echo(f"  {'circuit':28s} {'ports':>7s} {'input':>8s} {'loss':>6s} {'at rx':>8s} {'margin':>7s}")

    def num(value, width=8):
        return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}s}"

    shown = budget.paths if show_all else budget.paths[:12]
    for p in shown:
        low = p.at_receiver_dbm is not None and p.at_receiver_dbm < budget.floor_dbm
        click.echo(f"  {p.tx + ' -> ' + p.rx:28s} {f'{p.ingress}->{p.egress}':>7s} {num(p.input_dbm)} "
                   f"{num(p.path_loss_db, 6)} {num(p.at_receiver_dbm)} {num(p.margin_db, 7)}"
                   + ("  below sensitivity + margin" if low else ""))
    if len(shown) < len(budget.paths):
        click.echo(f"  ... {len(budget.paths) - len(shown)} more (--all)")
    for line in budget.skipped:
        click.echo(f"  not measured: {line}")
    for finding in budget.findings:
        click.echo(f"lumion-hil: {finding.text}")
    if json_out is not None:
        json_out.write_text(json.dumps({"paths": [dict(dataclasses.asdict(p), path_loss_db=p.path_loss_db)
                                                  for p in budget.paths],
                                        "findings": [dataclasses.asdict(f) for f in budget.findings],
                                        "shared_loss_db": budget.shared_loss_db, "skipped": budget.skipped}, indent=1))
    below = [p for p in budget.paths if p.at_receiver_dbm is not None and p.at_receiver_dbm < budget.floor_dbm]
    if budget.findings or below:
        sys.exit(ExitCode.TESTS_FAILED)


@bench.command("schema")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file.")
def bench_schema(output: Path | None) -> None:
    """Print the JSON schema of bench files (for editors and CI linters)."""
    text = bench_json_schema()
    if output:
        output.write_text(text + "\n", encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)
