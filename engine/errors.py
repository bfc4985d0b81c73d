"""The base of every error carl reports to a user as one line (what is wrong, and where)."""


class CarlError(Exception):
    """A user-facing failure: `str(exc)` is the whole message, no traceback needed."""
