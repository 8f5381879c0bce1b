"""A bench as a labgrid place: shared by a lab's engineers and CI runners on many machines.

labgrid (https://labgrid.readthedocs.io) is the lab's own distributed engine: a coordinator,
exporters on the machines wired to the hardware, places (a bench's resources, with tags) and
reservations. A bench file names its place (``place:`` section), or ``LG_COORDINATOR`` and
``LG_PLACE`` do, as for ``labgrid-client``. Then ``lumion-hil run``:

1. makes a reservation for the place (filter ``name=<place>``, or the section's tags) and waits
   for it to be allocated (``--wait``, with a limit; busy without it: exit status 6);
2. acquires the place, its comment saying which run holds it (``lumion-hil run pid N on HOST
   since T``), so that a run killed with ``kill -9`` leaves an acquisition the next run names;
3. takes instrument and host addresses from the place's resources where the bench file says
   ``place`` (:func:`address_of`), and the switch ports the bench may use from the place's
   ``ports`` tag (two places sharing one switch each own their ports);
4. releases the place and cancels the reservation at the end, after failures, Ctrl-C and
   SIGTERM too.

The acquisition is labgrid's (``host/user``, as ``labgrid-client`` shows it); a stale one is
never taken over silently: ``lumion-hil bench release`` releases it, naming who held it.
labgrid is an optional dependency (``pip install 'lumion-hil[labgrid]'``), imported only when a
bench has a place."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

DEFAULT_COORDINATOR = "127.0.0.1:20408"  # labgrid's default
_COMMENT = re.compile(r"lumion-hil run pid (?P<pid>\d+) on (?P<host>\S+) since (?P<since>\S+)")


class PlaceError(Exception):
    """A place that cannot be used: no coordinator, no such place, a bad ``ports`` tag."""


class PlaceBusy(PlaceError):
    """Another run (or a labgrid user) holds the place, or holds its reservation."""


@dataclass(frozen=True)
class PlaceSpec:
    coordinator: str
    name: str | None
    tags: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        what = self.name or ",".join(f"{k}={v}" for k, v in sorted(self.tags.items()))
        return f"place {what!r} on {self.coordinator}"


def place_spec(bench) -> PlaceSpec | None:
    """The bench's place: its ``place:`` section, with ``LG_COORDINATOR`` and ``LG_PLACE``
    taking precedence as they do for labgrid-client (for a bench wholly emulated in-process,
    only where its file names a place: an engineer's LG_PLACE is not the default bench's).
    None: no place, the local file lock guards the bench."""
    section = bench.place
    if section is None and bench.all_emulated:
        return None
    name = os.environ.get("LG_PLACE") or (section.name if section is not None else None)
    if section is None and not name:
        return None
    coordinator = os.environ.get("LG_COORDINATOR") or (section.coordinator if section is not None else None)
    tags = dict(section.tags) if section is not None and not os.environ.get("LG_PLACE") else {}
    return PlaceSpec(coordinator or DEFAULT_COORDINATOR, name, tags)


def parse_ports(text: str) -> list[int]:
    """A ``ports`` tag, ``1-8,33-40``, as the port numbers."""
    ports: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise PlaceError(f"ports tag {text!r}: {part!r} is not a port or a range LOW-HIGH")
        ports += range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)
    return ports


@dataclass
class Holder:
    """Who holds a place: labgrid's ``host/user`` and, for a lumion-hil run, its pid and start."""

    acquired_by: str | None
    comment: str = ""
    pid: int | None = None
    host: str | None = None
    since: str | None = None

    @property
    def stale(self) -> bool | None:
        """True: a run on this machine that is gone (killed). None: cannot tell from here."""
        if self.pid is None or self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def describe(self) -> str:
        if not self.acquired_by:
            return "nobody"
        text = self.acquired_by + (f" ({self.comment})" if self.comment else "")
        if self.stale:
            text += ": a stale acquisition, that run is gone; `lumion-hil bench release` releases it"
        return text


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="milliseconds")


def _run_comment() -> str:
    return f"lumion-hil run pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"


class LabgridPlace:
    """One bench's place on a labgrid coordinator, through labgrid's own client session."""

    def __init__(self, spec: PlaceSpec):
        self.spec = spec
        self.token: str | None = None
        self.acquired = False
        self._session = None
        try:
            from labgrid.remote import client as lg_client
            from labgrid.remote.common import Reservation, ReservationState
            from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2
        except ImportError:
            raise PlaceError(f"{spec.describe()}: labgrid is not installed (pip install 'lumion-hil[labgrid]')") \
                from None
        self._client, self._pb2, self._Reservation, self._State = lg_client, pb2, Reservation, ReservationState

    # -- the session -------------------------------------------------------------------------------

    @property
    def session(self):
        if self._session is None:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    self._session = self._client.start_session(self.spec.coordinator)
            except Exception as exc:  # grpc's and labgrid's errors alike: no coordinator there
                raise PlaceError(f"{self.spec.describe()}: cannot reach the labgrid coordinator: {exc}") from None
        return self._session

    def _do(self, coroutine):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return self.session.loop.run_until_complete(coroutine)
        except self._client.Error as exc:
            raise PlaceError(f"{self.spec.describe()}: {exc}") from None
        except Exception as exc:
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise PlaceError(f"{self.spec.describe()}: the coordinator refused: {details}") from None

    def _sync(self) -> None:
        self._do(self.session.sync_with_coordinator())

    def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
                session.loop.run_until_complete(session.stop())
                session.loop.run_until_complete(session.close())

    # -- what the coordinator says ------------------------------------------------------------------

    def place(self, name: str | None = None):
        """The place object (labgrid's), freshly synchronized."""
        self._sync()
        name = name or self.spec.name
        if name is None:
            raise PlaceError(f"{self.spec.describe()}: no place allocated yet")
        place = self.session.places.get(name)
        if place is None:
            known = ", ".join(sorted(self.session.places)) or "none"
            raise PlaceError(f"{self.spec.describe()}: no such place on the coordinator (places: {known})")
        return place

    def holder(self, name: str | None = None) -> Holder:
        place = self.place(name)
        holder = Holder(place.acquired, place.comment or "")
        m = _COMMENT.search(place.comment or "") if place.acquired else None
        if m:
            holder.pid, holder.host, holder.since = int(m["pid"]), m["host"], m["since"]
        return holder

    def reservation_of(self, name: str | None):
        """The reservation a place is allocated to (labgrid's Reservation), or None."""
        place = self.place(name)
        if not place.reservation:
            return None
        reply = self._do(self.session.stub.GetReservations(self._pb2.GetReservationsRequest()))
        for res in reply.reservations:
            if res.token == place.reservation:
                return self._Reservation.from_pb2(res)
        return None

    def ports(self) -> list[int] | None:
        """The switch ports this place owns (its ``ports`` tag), or None: the whole switch."""
        tag = self.place(self.name).tags.get("ports")
        return parse_ports(tag) if tag else None

    def check_shared_switch(self) -> None:
        """Places sharing one switch (the same ``switch`` tag) must own disjoint ports."""
        mine = self.place(self.name)
        switch = mine.tags.get("switch")
        if not switch or "ports" not in mine.tags:
            return
        own = set(parse_ports(mine.tags["ports"]))
        for other in self.session.places.values():
            if other.name == mine.name or other.tags.get("switch") != switch or "ports" not in other.tags:
                continue
            shared = sorted(own & set(parse_ports(other.tags["ports"])))
            if shared:
                raise PlaceError(f"places {mine.name!r} and {other.name!r} share switch {switch!r} and both claim "
                                 f"port(s) {shared}: fix their ports tags (labgrid-client -p PLACE set-tags ports=...)")

    def resources(self) -> dict[str, tuple[str, dict]]:
        """The acquired place's resources: name (a match's rename, or the resource's own) ->
        (labgrid class, parameters)."""
        place = self.place(self.name)
        try:
            found = self.session.get_target_resources(place)
        except self._client.Error as exc:
            raise PlaceError(f"{self.spec.describe()}: {exc}") from None
        return {name: (entry.cls, dict(entry.args)) for (name, _cls), entry in found.items()}

    @property
    def name(self) -> str | None:
        return self.spec.name

    # -- reserve, acquire, release -------------------------------------------------------------------

    def reserve(self, wait_s: float | None, progress: Callable[[str], None] = lambda _: None) -> None:
        """Reserve the place and wait until the reservation is allocated: at most ``wait_s``
        (None: do not wait; busy at once). Raises PlaceBusy naming who holds it."""
        if self.spec.name is not None:
            holder = self.holder()
            if holder.acquired_by and wait_s is None:
                raise PlaceBusy(f"{self.spec.describe()} is acquired by {holder.describe()}")
        filters = dict(self.spec.tags)
        if self.spec.name is not None:
            filters["name"] = self.spec.name
        request = self._pb2.CreateReservationRequest(
            filters={"main": self._pb2.Reservation.Filter(filter=filters)}, prio=0.0)
        reply = self._do(self.session.stub.CreateReservation(request))
        self.token = reply.reservation.token
        started = time.monotonic()
        last_said = 0.0
        while True:
            res = self._poll()
            if res.state is self._State.allocated:
                names = [n for group in res.allocations.values() for n in group]
                if self.spec.name is None:
                    self.spec = PlaceSpec(self.spec.coordinator, names[0], self.spec.tags)
                return
            if res.state is not self._State.waiting:
                self.cancel()
                raise PlaceError(f"{self.spec.describe()}: the reservation is {res.state.name}")
            waited = time.monotonic() - started
            if wait_s is None or waited >= wait_s:
                who = self.holder().describe() if self.spec.name else "other reservations"
                self.cancel()
                raise PlaceBusy(f"{self.spec.describe()} is busy" + (f" after waiting {waited:.0f} s" if wait_s else "")
                                + f": held by {who}")
            if waited - last_said >= 5 or last_said == 0:
                who = self.holder().describe() if self.spec.name else "other reservations"
                progress(f"waiting for {self.spec.describe()} ({waited:.0f} s of {wait_s:g} s): held by {who}")
                last_said = waited or 1e-9
            time.sleep(0.5)

    def _poll(self):
        reply = self._do(self.session.stub.PollReservation(self._pb2.PollReservationRequest(token=self.token)))
        return self._Reservation.from_pb2(reply.reservation)

    def acquire(self) -> str:
        """Acquire the allocated place, saying in its comment which run holds it. Returns
        labgrid's ``host/user`` of the acquisition."""
        self._do(self.session.stub.SetPlaceComment(self._pb2.SetPlaceCommentRequest(
            placename=self.spec.name, comment=_run_comment())))
        self._do(self.session.stub.AcquirePlace(self._pb2.AcquirePlaceRequest(placename=self.spec.name)))
        self.acquired = True
        return self.place().acquired

    def release(self) -> None:
        """Release the place (if this run acquired it) and cancel the reservation; each step is
        tried whatever the other did."""
        errors = []
        if self.acquired:
            try:
                self._do(self.session.stub.ReleasePlace(self._pb2.ReleasePlaceRequest(placename=self.spec.name)))
                self._do(self.session.stub.SetPlaceComment(self._pb2.SetPlaceCommentRequest(
                    placename=self.spec.name, comment="")))
                self.acquired = False
            except PlaceError as exc:
                errors.append(exc)
        try:
            self.cancel()
        except PlaceError as exc:
            errors.append(exc)
        if errors:
            raise errors[0]

    def cancel(self) -> None:
        if self.token is not None:
            token, self.token = self.token, None
            self._do(self.session.stub.CancelReservation(self._pb2.CancelReservationRequest(token=token)))

    def release_stale(self) -> Holder:
        """``lumion-hil bench release``: release whoever holds the place (labgrid's --kick) and
        cancel the reservation it was allocated to. Returns who held it."""
        holder = self.holder()
        if not holder.acquired_by:
            return holder
        res = self.reservation_of(self.spec.name)
        self._do(self.session.stub.ReleasePlace(self._pb2.ReleasePlaceRequest(placename=self.spec.name)))
        self._do(self.session.stub.SetPlaceComment(self._pb2.SetPlaceCommentRequest(
            placename=self.spec.name, comment="")))
        if res is not None:
            self._do(self.session.stub.CancelReservation(self._pb2.CancelReservationRequest(token=res.token)))
        return holder


def address_of(name: str, cls: str, params: dict) -> str:
    """What the bench's drivers open, from a place's resource (labgrid's own resource types):
    PyVISADevice -> a VISA resource string; NetworkSerialPort (ser2net) -> a pyserial URL;
    NetworkService -> ``user@address`` for ssh."""
    if cls == "PyVISADevice":
        # labgrid's PyVISADriver opens TYPE::URL::INSTR; a raw socket (::SOCKET) is kept as given.
        resource = f"{params['type']}::{params['url']}"
        return resource if resource.upper().endswith("::SOCKET") or resource.upper().endswith("::INSTR") \
            else resource + "::INSTR"
    if cls == "NetworkSerialPort":
        scheme = "rfc2217" if params.get("protocol", "rfc2217") == "rfc2217" else "socket"
        return f"{scheme}://{params['host']}:{params['port']}"
    if cls == "NetworkService":
        port = int(params.get("port", 22))
        where = f"{params['username']}@{params['address']}"
        return where if port == 22 else f"ssh://{where}:{port}"  # ssh's own URI form for another port
    raise PlaceError(f"resource {name!r} is a {cls}: lumion-hil takes instruments from PyVISADevice or "
                     "NetworkSerialPort resources and hosts from NetworkService ones")


PLACE_ENV = "LUMION_HIL_PLACE"  # what `lumion-hil run` tells the suites of the place it holds (JSON)


def wanted_from_place(bench) -> list[str]:
    """The names a bench takes from its place: instruments whose ``resource`` and hosts whose
    ``address`` is ``place`` (a bench file read without a held place keeps the word)."""
    return [n for n, spec in bench.instruments.items() if spec.resource == "place"] + \
        [h.name for h in bench.topology.hosts if h.address == "place"]


def apply_place(data: dict, info: dict) -> dict:
    """The bench file (as data) with what the held place gives: addresses where it says
    ``place`` and the switch ports it owns. ``info``: what ``lumion-hil run`` found (PLACE_ENV)."""
    resources = info.get("resources") or {}
    for name, spec in (data.get("instruments") or {}).items():
        if isinstance(spec, dict) and spec.get("resource") == "place" and name in resources:
            spec["resource"] = resources[name]
    for host in (data.get("topology") or {}).get("hosts") or []:
        if isinstance(host, dict) and host.get("address") == "place" and host.get("name") in resources:
            host["address"] = resources[host["name"]]
    if info.get("ports") is not None:
        safety = data.setdefault("safety", {})
        if isinstance(safety, dict):
            safety["owned_ports"] = list(info["ports"])
    return data


def hold(spec: PlaceSpec, wanted: list[str], wait_s: float | None,
         progress: Callable[[str], None]) -> tuple["LabgridPlace", dict]:
    """Reserve, wait for and acquire the place; find the addresses ``wanted`` and the ports it
    owns. Returns the held place (release it) and what the suites are told (PLACE_ENV). On any
    error the reservation is cancelled and the place released before the error goes up."""
    place = LabgridPlace(spec)
    try:
        place.reserve(wait_s, progress)
        acquired_by = place.acquire()
        place.check_shared_switch()
        found = place.resources()
        missing = [n for n in wanted if n not in found]
        if missing:
            have = ", ".join(f"{n} ({cls})" for n, (cls, _) in sorted(found.items())) or "none"
            raise PlaceError(f"{spec.describe()}: the bench takes {missing} from the place, which has no resource of "
                             f"that name (its resources: {have}); name them with labgrid-client add-named-match")
        resources = {n: address_of(n, *found[n]) for n in wanted}
        info = {"coordinator": spec.coordinator, "place": place.name, "acquired_by": acquired_by,
                "since": _now(), "reservation": place.token, "ports": place.ports(),
                "resources": resources}
        return place, info
    except BaseException:
        with contextlib.suppress(Exception):
            place.release()
        place.close()
        raise
