"""Instrument drivers, one file per model, and the small protocols the suites use."""
