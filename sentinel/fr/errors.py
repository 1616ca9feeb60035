"""The one error type the flight-recorder readers raise for bad input.

Everything that reads outside data (dump files, live snapshots) converts every failure into
:class:`FrFormatError` with a one-line message naming the file/field and what is wrong, so commands can
print it and exit 2 and daemons can log and count it — never a traceback.
"""

from __future__ import annotations


class FrFormatError(ValueError):
    """A flight-recorder dump (or snapshot) is unusable: corrupt, refused, too large or of unknown shape."""
