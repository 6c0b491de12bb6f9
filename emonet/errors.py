"""The failures a tool reports in one line, by kind, each with its own exit code (``--help`` lists them)."""
from __future__ import annotations


class ToolError(Exception):
    """A failure the tools report as one ``error: ...`` line and exit with :attr:`exit_code`."""

    exit_code = 1


class InputError(ToolError):
    """A path or value the user gave cannot be used; the message says which and why (exit 2)."""

    exit_code = 2


class OutputError(ToolError):
    """An output could not be written (a full disk, an encoder that refused); the outputs finished before it
    are kept (exit 3)."""

    exit_code = 3


class HelperError(OutputError):
    """A helper process (decoding, drawing, encoding, plotting) died; the message says which and why (exit 4)."""

    exit_code = 4


EXIT_CODES = """exit codes: 0 done; 1 done, but some input was read only in part or failed (said on the way);
  2 bad input or options; 3 an output could not be written; 4 a helper process died; 130 interrupted
  (Ctrl-C or SIGTERM: every finished frame is kept)
"""
