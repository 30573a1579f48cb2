"""What a secret is shown as, and how short a string can be and still be scrubbed.

Below `verirl._secrets` and `verirl._hub_token`, which both show secrets as
`HIDDEN`: a module of its own, so that neither imports the other for it.
"""

from __future__ import annotations

__all__ = ["HIDDEN", "MIN_SCRUBBED"]

HIDDEN = "<hidden>"
"""A secret as every repr, log line and error message shows it."""
MIN_SCRUBBED = 4
"""Shorter strings would scrub ordinary words; tokens are much longer."""
