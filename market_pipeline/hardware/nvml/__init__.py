"""The `nvml` backend: the GPUs of this host through pynvml.

`adapter.NvmlAdapter` is the backend; `devices` reads GPUs, MIG instances, processes, health
and NVLink through NVML; `processes` says which task and tenant a GPU process is; `snapshot`
is what the backend sees as one JSON-ready dict. Import the concrete modules directly; this
package re-exports nothing.
"""
