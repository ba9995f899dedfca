"""The simulator's one exception family."""


class SimulationError(Exception):
    """A simulation cannot run as asked (bad trace, bad configuration)."""


class TraceError(SimulationError):
    """A trace file is missing, unreadable or malformed."""


class ConfigError(SimulationError):
    """A simulator configuration file or override is invalid."""
