"""Errors a user can fix, shared by the command line and the libraries under it.

They live here, below everything that raises them, so a library never imports the CLI to
raise one (the CLI imports the libraries, not the other way round). ``tenure`` prints any
:class:`UsageError` as one line, exit code 2, no traceback.
"""

from __future__ import annotations

__all__ = ["TraceError", "UsageError"]


class UsageError(Exception):
    """A problem the user can fix (a bad flag, a missing or malformed file, an unknown name)."""


class TraceError(UsageError):
    """A malformed or truncated trace file (one line, names the file and line)."""
