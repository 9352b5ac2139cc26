"""Errors of the offline market simulator."""

from __future__ import annotations


class SimulationInputError(ValueError):
    """An input of the simulator (trace file, setting, strategy name) is invalid; the message
    names the file, column or setting and the problem."""
