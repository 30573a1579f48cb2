"""Redaction of credentials in user-given strings (`verirl._secrets`)."""

from __future__ import annotations

import pytest

from verirl._secrets import redact_text, redact_url

SECRET = "s3cretpw"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # A password may hold any of the characters a URL parser splits on.
        ("http://u:s3cret#pw@127.0.0.1:1", "http://***@127.0.0.1:1"),
        ("http://u:s3cret?pw@127.0.0.1:1", "http://***@127.0.0.1:1"),
        ("http://u:s3cret/pw@127.0.0.1:1/x", "http://***@127.0.0.1:1/x"),
        ("https://u:s3cret@pw@h", "https://***@h"),
        ("http://u:s3cretpw@127.0.0.1:1/\x01", "http://***@127.0.0.1:1/\x01"),
        # Scheme-less values: a host, an address, anything a user typed.
        ("u:s3cretpw@h", "***@h"),
        ("u:s3cret#pw@h:8000", "***@h:8000"),
        ("//u:s3cretpw@h", "***@h"),
        # An @ in the path is redacted too: over-redaction beats a leak.
        ("http://h:1/x@y", "http://***@y"),
        # Nothing to redact.
        ("http://127.0.0.1:8000/health", "http://127.0.0.1:8000/health"),
        ("h:8000", "h:8000"),
        ("", ""),
    ],
)
def test_redact_text_cuts_everything_before_the_last_at(value: str, expected: str) -> None:
    assert redact_text(value) == expected
    assert redact_url(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "http://u:s3cretpw#x@h",
        "http://u:s3cretpw?x@h",
        "http://u:s3cretpw/x@h",
        "http://u:s3cretpw\\x@h",
        "http://u:s3cretpw[x@h",
        "http://u:s3cretpw@x@h",
        "http://u:s3cretpw%40x@h",
        "u:s3cretpw#@h",
        "http:/u:s3cretpw@h",
        "HTTP://u:s3cretpw@h",
        "ht tp://u:s3cretpw@h",
        "http://u:s3cretpw@h/\x01\x00",
    ],
)
def test_redact_text_never_shows_the_password(value: str) -> None:
    assert SECRET not in redact_text(value)
    assert SECRET not in repr(redact_text(value))
    assert SECRET not in redact_url(value)
