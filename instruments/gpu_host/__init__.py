"""The GPU host agent (runs on each GPU host, answers JSON lines on stdin/stdout), its backends
(NVML, /sys/class/net links, job control, nccl-tests) and the harness's client for it."""
