"""Errors a user can fix from the message alone.

The command line (experiments/launch.py) prints a UserError as one `error: ...`
paragraph on stderr and exits 1, with no traceback (TBA_DEBUG=1 shows it); any
other exception is a bug and keeps its traceback. Each message names the value,
file or directory at fault and what to do.
"""


class UserError(Exception):
  """A config value, a data file, a workdir or a command line the user can fix."""


class ConfigError(UserError, ValueError):
  """A config value that cannot run; the message names the key and what is allowed."""


class DataError(UserError, ValueError):
  """A data file that cannot be used: the message names the file (and line) and what is wrong."""
