"""The emulated bench: one physical world, and an emulator per instrument model served over the
transport its real instrument uses."""
