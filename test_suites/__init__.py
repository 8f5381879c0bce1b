"""The harness's suites: what a lab runs against its bench, and CI against the emulated one."""
