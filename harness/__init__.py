"""The harness core: bench config, timeline, measurements, safety, records, CLI. No pytest, no wire protocol."""
