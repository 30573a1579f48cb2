"""Every error verirl raises on purpose.

Each one also subclasses the built-in exception a caller would catch without
knowing verirl, so ``except TimeoutError`` or ``except FileNotFoundError``
keep working::

    VeriRLError
    ├── ConfigError(ValueError)                  bad input, at construction/parse time
    ├── EnvServerUnavailable(TimeoutError)       .url .elapsed .last_error
    ├── VLLMServerError(RuntimeError)            server faults; launch command missing
    │   ├── PortInUseError                       .host .port; nothing was spawned
    │   ├── VLLMServerExited                     .returncode .log_tail
    │   │   └── VLLMServerUnresponsive           .url .elapsed .last_error; alive but
    │   │                                        not answering /health (watchdog)
    │   ├── VLLMStartupTimeout(TimeoutError)     .timeout .log_tail; tree already gone
    │   └── VLLMServerUnavailable(TimeoutError)  .url .elapsed .last_error; a server
    │                                            started elsewhere never answered
    ├── CheckpointNotFoundError(FileNotFoundError)  .searched
    └── CheckpointSourceError                    a source could not be read; see __cause__
"""

from __future__ import annotations

__all__ = [
    "CheckpointNotFoundError",
    "CheckpointSourceError",
    "ConfigError",
    "EnvServerUnavailable",
    "PortInUseError",
    "VLLMServerError",
    "VLLMServerExited",
    "VLLMServerUnavailable",
    "VLLMServerUnresponsive",
    "VLLMStartupTimeout",
    "VeriRLError",
]


class VeriRLError(Exception):
    """Base of every error verirl raises on purpose.

    Its message never carries a credential a user typed into a value it
    quotes (a URL's ``user:password@``, ``?token=V``, ``api_key=V``): each is
    hidden as the error is made (`verirl._secrets.redact_message`).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(_redacted(arg) if isinstance(arg, str) else arg for arg in args))


def _redacted(message: str) -> str:
    from verirl._secrets import redact_message  # noqa: PLC0415 - it imports this module

    return redact_message(message)


def _quoted(value: object) -> str:
    from verirl._fs import quoted  # noqa: PLC0415 - keep this module's imports at none

    return quoted(value)


def _where(log_path: str | None) -> str:
    """``; full log: PATH``, the path shown escaped (a control character would forge a line)."""
    from verirl._fs import printable  # noqa: PLC0415 - keep this module's imports at none

    return f"; full log: {printable(log_path)}" if log_path else ""


class ConfigError(VeriRLError, ValueError):
    """Bad input; the message names the field and the offending value."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: object = None,
        reason: str | None = None,
    ) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(message)

    @classmethod
    def invalid(cls, field: str, value: object, reason: str) -> ConfigError:
        """Build the usual message: ``field=value: reason``."""
        return cls(f"{field}={_quoted(value)}: {reason}", field=field, value=value, reason=reason)

    def renamed(self, field: str) -> ConfigError:
        """The same error under another name (a CLI flag, an environment variable).

        Only the leading ``field=`` changes, so a value the message left out
        (a secret) stays left out.
        """
        message = str(self)
        if self.field is not None and message.startswith(f"{self.field}="):
            message = field + message[len(self.field) :]
        else:
            message = f"{field}: {message}"
        return type(self)(message, field=field, value=self.value, reason=self.reason)


class _Unhealthy(VeriRLError, TimeoutError):
    """A service at ``url`` did not answer healthy within ``elapsed`` seconds."""

    _what = "service"
    _hint = ""

    def __init__(self, url: str, elapsed: float, last_error: str | None) -> None:
        self.url = url
        self.elapsed = elapsed
        self.last_error = last_error
        super().__init__(
            f"{self._what} {url} not healthy after {elapsed:.1f}s "
            f"(last error: {last_error or 'none'}){self._hint}"
        )


class EnvServerUnavailable(_Unhealthy):
    """The reward environment server did not answer healthy in time."""

    _what = "env server"


class VLLMServerError(VeriRLError, RuntimeError):
    """The vLLM server could not be launched or failed."""


class PortInUseError(VLLMServerError):
    """The server's port is already bound; nothing was spawned."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.port = port
        self.host = host
        super().__init__(
            f"port={port}: already in use on {host}; stop whatever holds it or choose another port"
        )


def _format_tail(log_tail: str) -> str:
    """The server log's last lines, quoted: each behind ``| ``, control characters escaped.

    What the server wrote must not drive the terminal (colours, a screen
    clear, a window title) nor pass for one of verirl's own lines.
    """
    if not log_tail.strip():  # the tail reads past blank lines, however many: none is left
        return " (this run's server log is empty or blank)"
    lines = log_tail.rstrip("\n").split("\n")
    quoted = "\n".join(f"| {line.translate(_TAIL_CONTROLS)}" for line in lines)
    return "\n--- last lines of the server log ---\n" + quoted


# C0 and C1 control characters but the tab, shown as repr() writes them (\x1b, \r, \x9b).
_TAIL_CONTROLS = {
    code: repr(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) != "\t"
}


class VLLMServerExited(VLLMServerError):
    """The server process exited before it was ready (or while in use)."""

    def __init__(self, returncode: int | None, log_tail: str, log_path: str | None = None) -> None:
        self.returncode = returncode
        self.log_tail = log_tail
        self.log_path = log_path
        where = _where(log_path)
        super().__init__(
            f"vLLM server exited with code {returncode}{where}{_format_tail(log_tail)}"
        )


class VLLMServerUnresponsive(VLLMServerExited):
    """The server stopped answering ``/health`` for ``elapsed`` seconds while in use.

    Raised (through the watchdog) like a `VLLMServerExited`, because a server
    that answers nothing is as dead to the trainer as one that exited; verirl
    stops it. ``returncode`` is ``None`` when it was still running (or was
    never ours to watch: another rank's or a remote server).
    """

    def __init__(
        self,
        url: str,
        elapsed: float,
        last_error: str | None,
        *,
        log_tail: str = "",
        log_path: str | None = None,
        returncode: int | None = None,
    ) -> None:
        super().__init__(returncode, log_tail, log_path)
        self.url = url
        self.elapsed = elapsed
        self.last_error = last_error
        where = _where(log_path)
        tail = _format_tail(log_tail) if log_tail or log_path else ""
        message = (
            f"vLLM server {url} did not answer /health for {elapsed:.1f}s "
            f"(last error: {last_error or 'none'}){where}{tail}"
        )
        self.args = (_redacted(message),)


class VLLMStartupTimeout(VLLMServerError, TimeoutError):
    """The server was not healthy within ``startup_timeout``; it has been torn down."""

    def __init__(self, timeout: float, log_tail: str, log_path: str | None = None) -> None:
        self.timeout = timeout
        self.log_tail = log_tail
        self.log_path = log_path
        where = _where(log_path)
        super().__init__(
            f"vLLM server not healthy after {timeout:.1f}s and was stopped{where}"
            f"{_format_tail(log_tail)}"
        )


class VLLMServerUnavailable(_Unhealthy, VLLMServerError):
    """A vLLM server this process did not start (rank 0's, a remote one) never became healthy."""

    _what = "vLLM server"
    _hint = "; it is started by local rank 0 or runs on the remote host"


class CheckpointNotFoundError(VeriRLError, FileNotFoundError):
    """No (complete) checkpoint where one was asked for; names every place searched.

    ``reason``, when given, says why (an explicit path that does not exist);
    ``searched`` is empty when no source was configured.
    """

    def __init__(
        self, request: str, searched: tuple[str, ...] | list[str], *, reason: str | None = None
    ) -> None:
        self.request = request
        self.searched = tuple(searched)
        self.reason = reason
        places = ", ".join(self.searched) if self.searched else "no sources configured"
        if reason:
            super().__init__(f"no checkpoint for {_quoted(request)}: {reason}; searched: {places}")
        else:
            super().__init__(f"no complete checkpoint for {_quoted(request)}; searched: {places}")


class CheckpointSourceError(VeriRLError):
    """A checkpoint source could not be read; ``__cause__`` holds the original error.

    ``repo_missing`` is True when the source said its repository does not
    exist (HTTP 404 to a request that carried a token): what ``auto`` may take
    for "no checkpoint pushed yet" on a first attempt. ``checkpoint_unreadable``
    is True when a checkpoint is there but cannot be read (permissions, EIO,
    its download held by another process past ``lock_timeout``):
    it may be the newest, so no older one is resumed from in its place;
    ``step`` is that checkpoint's step when its name says it (a newer one
    found elsewhere may then be resumed from).
    """

    def __init__(
        self,
        *args: object,
        repo_missing: bool = False,
        checkpoint_unreadable: bool = False,
        step: int | None = None,
    ) -> None:
        super().__init__(*args)
        self.repo_missing = repo_missing
        self.checkpoint_unreadable = checkpoint_unreadable
        self.step = step
