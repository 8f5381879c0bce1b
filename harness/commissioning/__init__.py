"""Commissioning a bench: from the instruments and hosts on a desk to its bench file.

- ``discover``: what answers at the addresses given (and on this machine), what each host has,
  and a bench file drafted from it, every value marked read, measured, given or assumed;
- ``walk``: where each NIC's fibres land on the switch, found by light and carrier;
- ``wiring``: the walk's findings beside the bench file's, and a patch for the file;
- ``budget``: the light budget of every circuit the topology can make, measured.

Each works on a bench opened as a run opens it (its lock or labgrid place held, the switch
guarded, the baseline restored at the end whatever happens) and talks to it only through the
drivers and the agents.
"""
