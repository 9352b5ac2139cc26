"""The `local-process` backend: tasks are real OS processes on this machine.

`adapter.LocalProcessAdapter` starts or adopts them, reads, signals and accounts for them;
`registry` is the task registry shared by processes; `processes` the OS probes (pids
pinned by start time); `gpus` this machine's NVIDIA GPUs when NVML sees any; `samples` the
workers' own utilisation logs as telemetry. A task's process tree is found and ended through
the shared `hardware.process_tree`. Import the concrete modules directly; this package
re-exports nothing.
"""
