"""The one error a bad constraint raises."""
from __future__ import annotations


class ConstraintError(ValueError):
  """A structured-output constraint that cannot be honoured exactly: malformed, using a feature the compiler
  does not implement (named in the message), or admitting no token sequence. Raised on the host, before
  anything is compiled for the device."""
