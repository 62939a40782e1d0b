"""Errors caused by the user's input (a config, a data file, a reward function).

The CLI prints these as one clear message (no traceback) and exits with status 2; anything else is a
bug in postrl and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message says what and where (file, line, key, sample)."""


class ConfigError(UserError, ValueError):
    """A config file or override that does not match the config's dataclass."""


class ModelError(UserError, ValueError):
    """A model path, hub name or setting that cannot be loaded; the message names it and what would work."""


class DataError(UserError, ValueError):
    """A data source or record is unusable; the message names the file, line and field."""
