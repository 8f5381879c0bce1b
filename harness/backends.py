"""Which backend a bench runs on (instruments/backend.py): the bench file's ``backend``, else
the emulated world where instruments are emulated, a served world where hosts are at
``world:HOST:PORT``, and a real bench otherwise. The harness names them, never imports them."""

from __future__ import annotations

from lumion_hil.harness.plugins import BACKENDS, PluginError, load_object
from lumion_hil.instruments.backend import BenchBackend


def backend_name(bench) -> str:
    """A name registered under the lumion_hil.backends entry points (the project's own:
    emulated, served, netns, real; see pyproject.toml), or module:factory."""
    if bench.backend:
        return bench.backend
    if bench.any_emulated:
        return "emulated"
    if any(h.world_address for h in bench.topology.hosts):
        return "served"
    return "real"


def load_backend(bench) -> BenchBackend:
    """The bench's backend, not yet started."""
    name = backend_name(bench)
    factory = load_object(name, BACKENDS, "backend")
    try:
        backend = factory(bench)
    except Exception as exc:
        raise PluginError(f"backend {name!r}: cannot make it for bench {bench.name!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(backend, BenchBackend):
        raise PluginError(f"backend {name!r} did not return a BenchBackend (instruments/backend.py)")
    return backend
