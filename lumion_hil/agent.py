"""The GPU host agent: ``python -m lumion_hil.agent`` (or ``lumion-hil-agent``) on a GPU host,
what the harness starts there over ssh. See :mod:`lumion_hil.instruments.gpu_host.agent`."""

from lumion_hil.instruments.gpu_host.agent import main

if __name__ == "__main__":
    main()
