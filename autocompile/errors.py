"""The one exception type that the command line turns into a single clear line."""


class UserError(Exception):
    """Bad input from the user: shown as one line, exit status 2, no traceback."""
