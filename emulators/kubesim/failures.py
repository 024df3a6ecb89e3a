"""The one error of the simulated cluster's own making (not the scenario's, not a pod's)."""

from __future__ import annotations


class SimulationError(Exception):
    """A part of the simulated cluster did not start or did not behave."""
