"""Plug-in points named in a bench file: a recovery controller, a bench backend. Each is named by
``module:attribute`` (a dotted path) or by the name of an entry point in its group, so a lab's
own package can register one (``[project.entry-points."lumion_hil.controllers"]``)."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from lumion_hil.harness.errors import HarnessError

CONTROLLERS = "lumion_hil.controllers"
BACKENDS = "lumion_hil.backends"


class PluginError(HarnessError):
    pass


def plugin_names(group: str) -> list[str]:
    """The names registered under ``group`` by the packages installed."""
    return sorted(ep.name for ep in entry_points(group=group))


def load_object(spec: str, group: str, what: str):
    """The object ``spec`` names: ``module:attribute``, or an entry point's name in ``group``.
    Saved stories and bench files from before the single package (``harness.x:Y``) still load."""
    if ":" not in spec:
        found = entry_points(group=group).select(name=spec)
        if not found:
            known = plugin_names(group)
            raise PluginError(f"{what} {spec!r}: no entry point of that name in {group} "
                              f"(known: {', '.join(known) or 'none'}; or give module:factory)")
        try:
            return next(iter(found)).load()
        except Exception as exc:
            raise PluginError(f"{what} {spec!r}: cannot load it: {exc}") from None
    module_name, _, attribute = spec.partition(":")
    if module_name.split(".")[0] in ("harness", "instruments"):
        module_name = f"lumion_hil.{module_name}"
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{what} {spec!r}: cannot load it: {exc}") from None
