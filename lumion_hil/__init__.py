"""lumion-hil: a hardware-in-the-loop test harness for reconfigurable optical fabrics.

One importable package, so that a lab's environment (which often holds InstrumentKit's
``instruments``) is never shadowed. The repository's top-level folders are its subpackages:

- ``lumion_hil.harness``: the core (bench config, controller, faults, records);
- ``lumion_hil.instruments``: drivers and protocols; ``.emulators`` the emulated bench;
  ``.gpu_host`` the GPU host agent;
- ``lumion_hil.fixtures``: the pytest plugin; ``lumion_hil.test_suites``: the suites;
- ``lumion_hil.reports``: the morning summary, Allure glue, plots;
- ``lumion_hil.benches``: the bench files shipped with the package.

Entry points: ``lumion-hil`` (or ``python -m lumion_hil``; its commands in ``lumion_hil.cli``),
and the GPU host agent ``lumion-hil-agent`` (or ``python -m lumion_hil.agent``, what the harness
runs over ssh).
"""



def __getattr__(name: str):
    # The version is looked up only when asked for: every emulated rank and agent is a Python
    # process that imports this package, and reading the installed metadata costs ~25 ms.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("lumion-hil")
        except PackageNotFoundError:  # a checkout that was never installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
