"""Converters and validators of `verirl.VLLMServer`'s constructor arguments.

They are attrs ``converter=`` and ``validator=`` hooks: each turns what a user
passed into the field's value or raises `ConfigError` naming the argument (its
alias, e.g. ``log_path``) and the value. Kept apart from the server so that
`verirl.vllm_server` reads as the server's life cycle; the generic checks they
build on live in `verirl._validate`.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from verirl._secrets import shown_command
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    check_host,
    check_int,
    check_number,
    check_port,
    check_seconds,
    check_text,
    has_control_chars,
)
from verirl.errors import ConfigError
from verirl.server.args import PLAN_FLAGS, own_flag

__all__ = [
    "FolderPath",
    "KeptFolder",
    "to_command",
    "to_devices",
    "to_env",
    "to_extra_args",
    "to_log_dir",
    "to_log_path",
    "v_bool",
    "v_count",
    "v_fraction",
    "v_host",
    "v_max_model_len",
    "v_model",
    "v_port",
    "v_seconds",
]


def _unportable(text: str) -> str | None:
    """Why ``text`` cannot be passed in argv or the environment, or ``None`` if it can."""
    if "\x00" in text:
        return "contains a null byte, which a command line or environment cannot carry"
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return "contains a character that cannot be encoded for a command line (a lone surrogate)"
    return None


def to_devices(value: Iterable[int]) -> tuple[int, ...]:
    """``devices`` as a tuple of distinct GPU indices; anything else is a `ConfigError`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError.invalid("devices", value, "must be a sequence of GPU indices, e.g. (1,)")
    items: tuple[object, ...] = tuple(value)
    if not items:
        raise ConfigError.invalid("devices", value, "must name at least one GPU")
    devices: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < MAX_GPUS:
            raise ConfigError.invalid(
                "devices", value, f"GPU indices must be integers from 0 to {MAX_GPUS - 1}"
            )
        devices.append(item)
    if len(set(devices)) != len(devices):
        raise ConfigError.invalid("devices", value, "GPU indices must be unique")
    return tuple(devices)


def _to_strings(field: str, value: Iterable[str]) -> tuple[str, ...]:
    """Server flags or a command as strings; an error shows them redacted (an ``--api-key``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError.invalid(
            field, shown_command(value), "must be a sequence of strings, not one string"
        )
    items: tuple[object, ...] = tuple(value)
    if not all(isinstance(item, str) for item in items):  # each word redacted as its text
        raise ConfigError.invalid(field, shown_command(list(items)), "must contain only strings")
    strings = tuple(str(item) for item in items)
    for index, item in enumerate(strings):
        problem = _unportable(item)
        if problem:
            shown = shown_command(list(strings))
            raise ConfigError.invalid(field, shown, f"item {index} {problem}")
    return strings


def to_extra_args(value: Iterable[str]) -> tuple[str, ...]:
    """Server flags after verirl's own; one that would change those (``--port``) is refused.

    The server is waited on at the port, and planned with the GPUs, that
    verirl's own flags give it: an extra ``--port 9000`` would be a server
    nobody finds, for its whole start-up timeout.
    """
    args = _to_strings("extra_args", value)
    found = own_flag(args)
    if found is not None:
        written, flag = found
        raise ConfigError.invalid(
            "extra_args",
            shown_command(list(args)),
            f"{written} sets the server's {flag}, which "
            + (
                f"is refused: {PLAN_FLAGS[flag]}"
                if flag in PLAN_FLAGS
                else "verirl sets itself and waits on; give it as the server's own field instead"
            ),
        )
    return args


def to_command(value: Iterable[str] | None) -> tuple[str, ...] | None:
    """``command`` as a tuple of non-empty strings (shown redacted when refused), or ``None``."""
    if value is None:
        return None
    command = _to_strings("command", value)
    if not command or not all(command):
        raise ConfigError.invalid(
            "command", shown_command(list(command)), "must be a non-empty list of non-empty strings"
        )
    return command


def to_env(value: Mapping[str, str] | None) -> Mapping[str, str]:
    """``env`` as a read-only mapping; an error names a variable, never shows its value."""
    if value is None:
        return types.MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError.invalid("env", type(value).__name__, "must be a mapping of str to str")
    pairs: list[tuple[object, object]] = list(value.items())
    for name, item in pairs:
        if not isinstance(name, str) or not name or "=" in name:
            raise ConfigError.invalid("env", name, "variable names must be non-empty, without '='")
        problem = _unportable(name)
        if problem:
            raise ConfigError.invalid("env", name, f"the variable name {problem}")
        # Values are never echoed, only the variable's name: environment values may be secrets.
        if not isinstance(item, str):
            raise ConfigError.invalid(
                "env", name, f"value must be a str, not {type(item).__name__}"
            )
        problem = _unportable(item)
        if problem:
            raise ConfigError.invalid("env", name, f"the value of {name} {problem}")
    return types.MappingProxyType(dict(value))


def to_log_path(value: str | os.PathLike[str] | None) -> Path | None:
    """``log_path`` as a `Path` (a folder given is kept as one), or ``None``."""
    if value is None:
        return None
    raw: object = value
    if not isinstance(raw, (str, os.PathLike)):
        raise ConfigError.invalid("log_path", value, "must be a path or None")
    text = os.fspath(raw)
    if not isinstance(text, str):
        raise ConfigError.invalid("log_path", value, "must be a path or None")
    if not text:
        raise ConfigError.invalid("log_path", value, "is empty: give a file's or a folder's path")
    problem = _unportable(text)
    if problem:
        raise ConfigError.invalid("log_path", value, problem)
    last = os.path.basename(text.rstrip("".join(_SEPARATORS)))  # noqa: PTH119
    if text.endswith(_SEPARATORS) or last in (os.curdir, os.pardir):
        return FolderPath(text)  # `Path` forgets the slash (and a last ".") that say "a folder"
    if os.path.isdir(text):  # noqa: PTH112 - a folder now is a folder at start, or an error
        return KeptFolder(text)
    return Path(text)


def to_log_dir(value: str | os.PathLike[str] | None) -> Path | None:
    """``log_dir``: a folder that must exist when the server starts (never made, never a file)."""
    if value is None:
        return None
    raw: object = value
    text = os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError.invalid("log_dir", value, "must be a path or None")
    if not text:
        raise ConfigError.invalid("log_dir", value, "is empty: give a folder's path")
    problem = _unportable(text)
    if problem:
        raise ConfigError.invalid("log_dir", value, problem)
    return KeptFolder(text)


_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)


class FolderPath(type(Path())):  # type: ignore[misc]  # the concrete Path class of this OS
    """A ``log_path`` spelled with a trailing slash: a folder, made if missing."""

    folder = True
    must_exist = False


class KeptFolder(FolderPath):
    """A folder the user gave as one: it must still be one at start, else a `ConfigError`.

    ``log_dir``, or a ``log_path`` that was a directory when the server was
    made. Never made if missing: a folder that went (an unmounted disk, a
    removed run folder) is an error, never a file written at its path.
    """

    must_exist = True


def _field_name(attribute: attrs.Attribute[Any]) -> str:
    return attribute.alias or attribute.name


def v_model(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    """A model name: text, not blank, printable, encodable for a command line."""
    field = _field_name(attribute)
    text = check_text(field, value)
    if not text.strip():
        raise ConfigError.invalid(field, value, "must not be blank")
    if has_control_chars(text):
        raise ConfigError.invalid(field, value, "must not contain control characters")
    problem = _unportable(text)
    if problem:
        raise ConfigError.invalid(field, value, problem)


def v_host(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    """A host to bind or reach (see `check_host`)."""
    check_host(_field_name(attribute), value)


def v_port(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    """A TCP port, 1 to 65535."""
    check_port(_field_name(attribute), value)


def v_count(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    """A GPU count (tensor or data parallel size): 1 to `MAX_GPUS`."""
    check_int(_field_name(attribute), value, 1, MAX_GPUS)


def v_max_model_len(_: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    """A context length, 1 to `MAX_LENGTH`, or ``None`` (vLLM's own)."""
    if value is not None:
        check_int(_field_name(attribute), value, 1, MAX_LENGTH)


def v_fraction(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    """A fraction of GPU memory: above 0, at most 1."""
    check_number(_field_name(attribute), value, positive=True, at_most=1.0)


def v_seconds(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    """A positive, finite number of seconds."""
    check_seconds(_field_name(attribute), value, positive=True)


def v_bool(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    """``True`` or ``False``, nothing that merely tests true."""
    if not isinstance(value, bool):
        raise ConfigError.invalid(_field_name(attribute), value, "must be True or False")
