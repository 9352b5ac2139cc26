"""Node hardware adapter backends, chosen by `config.adapter.backend`.

Each backend (one subpackage each) is imported only when chosen, so a host without pynvml
(or without a DCGM endpoint) can still run the simulated backend. A backend class provides
`from_config(config) -> NodeAdapter`.
"""

from __future__ import annotations

import importlib

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.hardware.protocol import NodeAdapter

# backend name -> "module:ClassName"
BACKENDS: dict[str, str] = {
    "simulated": "market_pipeline.fleet.twin_adapter:SimulatedAdapter",
    "local-process": "market_pipeline.hardware.local_process.adapter:LocalProcessAdapter",
    "nvml": "market_pipeline.hardware.nvml.adapter:NvmlAdapter",
    "dcgm": "market_pipeline.hardware.dcgm.adapter:DcgmAdapter",
    "slurm": "market_pipeline.hardware.slurm.adapter:SlurmAdapter",
}


class AdapterBackendError(ValueError):
    """The configured backend is unknown or its module cannot be loaded."""


def backend_class(name: str) -> type:
    target = BACKENDS.get(name)
    if target is None:
        raise AdapterBackendError(f"adapter.backend: unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise AdapterBackendError(
                f"adapter.backend {name!r}: module {module_name} is not installed"
            ) from None
        raise
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise AdapterBackendError(f"adapter.backend {name!r}: {module_name} has no {class_name}") from None


def make_adapter(config: MarketPipelineConfig) -> NodeAdapter:
    """The adapter the config names, built by its class's `from_config`."""
    return backend_class(config.adapter.backend).from_config(config)
