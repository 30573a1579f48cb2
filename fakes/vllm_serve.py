r"""A stand-in for the vLLM server TRL launches: same flags, same HTTP API, real workers, no GPU.

By default it speaks what TRL 1.x's ``VLLMClient`` talks to: vLLM's own
OpenAI-compatible server, launched as ``trl.scripts.vllm_serve.build_command``
does (``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config '{"backend":
"nccl"}'``, ``--logprobs-mode processed_logprobs``, ``--max-logprobs -1``,
``--enable-scale-out``). With ``--fake-protocol trl-legacy`` (or
``FAKE_VLLM_PROTOCOL=trl-legacy``) it speaks TRL 0.2x's own ``trl vllm-serve``
instead. Run it wherever a test would run the real server::

    python -m fakes.vllm_serve --model Qwen/Qwen3-0.6B --host 127.0.0.1 --port 8001

or hand it to `verirl.VLLMServer`::

    import sys
    from verirl import VLLMServer

    with VLLMServer("m", command=[sys.executable, "-m", "fakes.vllm_serve"]) as server:
        ...  # GET {server.base_url}/health answers 200; TRL's VLLMClient works against it

It accepts every flag of trl's ``vllm-serve`` and the vLLM flags TRL 1.x adds
(underscore and dash spellings; ``--served-model-name``,
``--weight-transfer-config JSON`` (``null`` for none), ``--logprobs-mode``,
``--max-logprobs``, ``--[no-]enable-scale-out``, ``--uvicorn-log-level``,
``--model-impl``, and a leading ``serve MODEL`` as in ``vllm serve MODEL``),
starts ``tensor_parallel_size * data_parallel_size`` real worker processes the
way vLLM starts its engine workers, binds the port only once "loaded" (so the
port refuses connections until then, as with real vLLM), and serves:

vLLM protocol (the default)
    ``GET /health`` (200, empty body), ``/version``, ``/v1/models`` (one entry
    per ``--served-model-name``, else ``--model``); ``POST /v1/completions``
    (prompts as a string, strings, token ids or lists of token ids; ``n``
    choices per prompt, prompt-major; ``logprobs``, ``prompt_logprobs``,
    ``return_token_ids``, ``return_tokens_as_token_ids``, ``seed``),
    ``/v1/chat/completions`` (one conversation; text and ``image_url`` parts),
    and, unless ``--no-enable-scale-out`` (then 403 as in vLLM),
    ``/v1/chat/completions/render`` and ``/inference/v1/generate``. Only with
    ``VLLM_SERVER_DEV_MODE=1`` in the server's environment (else 404, as in
    vLLM): ``GET /server_info``, ``/get_world_size``, ``/is_paused``,
    ``/weight_info`` and ``POST /reset_prefix_cache``, ``/pause``, ``/resume``,
    ``/init_weight_transfer_engine``, ``/shutdown_weight_transfer_engine``,
    ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``.
    The weight-transfer calls need no NCCL: they are checked (bodies, and
    start/update/finish in order, with vLLM's 500s otherwise) and recorded.
trl-legacy protocol
    ``GET /health/`` (200 ``{"status": "ok"}``), ``/get_world_size/``,
    ``/get_tensor_parallel_size/``; ``/health`` is a 307 to ``/health/``.
Both
    ``GET /verirl/calls/``: the recorded dev-mode POSTs (``method``, ``path``,
    ``query``, ``body``: the JSON body, ``null`` if none, not JSON or over
    64 KiB, ``body_bytes``, ``status``), oldest first, the last 1000; ``/verirl/argv/``,
    ``/verirl/args/``, ``/verirl/workers/``: its argv, parsed flags and worker
    pids; ``/verirl/env/``: its environment, answered to loopback clients only
    (it may hold tokens).

Like Starlette under vLLM: unknown paths are 404 ``{"detail": "Not Found"}``,
another method 405 ``{"detail": "Method Not Allowed"}``, the trailing-slash
twin of a route a 307 to it; bad requests are 400 (a model name not served
404) with vLLM's body ``{"error": {"message", "type", "param", "code"}}``.
Bodies over 4 MiB are refused (413), and one request may ask for at most
500 000 tokens and logprob entries (``n``, ``max_tokens``, ``logprobs``,
prompt lengths together; beyond, 400), so hostile input costs bounded time.

The fake model is deterministic: text is tokenized as its UTF-8 bytes, and a
chat is rendered as ``<|role|>\ncontent\n`` per message then
``<|assistant|>\n`` (an image part as the 7 tokens of ``<image>``). Prompt
token ids may be anything below 2**18 (so real tokenizers' ids are accepted).
At each position a distribution over the 256 byte tokens (a permutation with
geometric probabilities, drawn from a hash of the model and the context) gives
every token a rank and a negative logprob, sorted together; generated ids are
byte tokens sampled from the top 8 (the top one at ``temperature=0``) by a
generator seeded from the prompt, the choice's index and ``seed``: the same
request gets the same answer, and ``prompt_logprobs`` of prompt + completion
give back the logprobs the completion was generated with. There is no end of
sequence: every choice has exactly ``max_tokens`` tokens (default 16, also on
the chat endpoint), ``finish_reason`` ``"length"``. With ``logprobs=k``
(``k >= 0``, ``-1``: all) the completions endpoint returns the sampled token
and ``k`` others, the best-ranked ones (at most the 256 byte tokens);
``prompt_logprobs=k`` likewise for each prompt token after the first. The
chat endpoint lists the first ``top_logprobs`` of those (the sampled one
first, as vLLM does), ``/inference/v1/generate`` the first ``max(k, 1)``;
the latter's entries carry ``token_id``, ``logprob`` and ``rank``, exactly as
vLLM 0.32 sends them (TRL 1.16 reads a ``token`` key there, so its
``generate(features=...)`` with logprobs fails on the fake as on vLLM 0.32;
``tests/engine`` checks the shapes against the real engine). ``--logprobs-mode`` is only
reported; values are always logprobs. Streaming is not supported (400).

``/v1/chat/completions/render`` answers vLLM's render shape: the rendered
``token_ids`` and, for a conversation with images, ``features``:
``{"mm_hashes": {"image": [sha256 of each image URL]}, "mm_placeholders":
{"image": [{"offset": o, "length": 7}]}, "kwargs_data": {"image": [base64
of b"verirl-fake-image:" + hash]}, "mm_metadata": null}``, deterministic and
never fetched or decoded. ``/inference/v1/generate`` checks ``features`` as
vLLM does (same modalities, lengths, sorted non-overlapping placeholders
inside ``token_ids``) and lets the image hashes steer generation, so
render + generate and a chat with the same images agree.

On SIGTERM or SIGINT it shuts down like uvicorn: stops serving, terminates
its workers, waits for them and exits 0. Its workers also die with it (they
set ``PR_SET_PDEATHSIG`` on Linux) unless told otherwise.

Behaviour knobs are environment variables, so ``VLLMServer(env=...)`` can set
them (a malformed value is an error naming the variable, exit status 2):

``FAKE_VLLM_PROTOCOL``
    ``vllm`` (default) or ``trl-legacy``: which server to be (the
    ``--fake-protocol`` flag wins over it).
``FAKE_VLLM_STARTUP_DELAY``
    seconds of "model loading" after the workers start and before the port is
    bound.
``FAKE_VLLM_LOAD_UNTIL``
    a file path: "loading" goes on (after ``FAKE_VLLM_STARTUP_DELAY``) until
    that file exists, so a test decides exactly when the port is bound.
``FAKE_VLLM_CRASH``
    ``"code:message"``: once the workers are up, write ``message`` to stderr
    and exit with ``code``, without stopping the workers (a crash).
``FAKE_VLLM_IGNORE_SIGTERM``
    ``1``: the server and its workers ignore SIGTERM; only SIGKILL stops them.
``FAKE_VLLM_WORKER_NEW_SESSION``
    ``1``: each worker calls ``setsid()``, leaving the server's process group
    (so a group-wide signal misses it).
``FAKE_VLLM_ORPHAN_WORKERS``
    ``1``: workers do not die with the server (no death signal), like engine
    workers that outlive a killed API server and keep their GPU.
``FAKE_VLLM_SHUTDOWN_DELAY``
    seconds a graceful shutdown takes before the server exits.

``VLLM_SERVER_DEV_MODE`` is read as vLLM reads it (an integer, non-zero: on).

Every worker logs ``Started worker process [PID]`` and the server logs
``Started server process [PID]``, then, once serving, uvicorn's ``Application
startup complete.`` and ``Uvicorn running on http://HOST:PORT (Press CTRL+C
to quit)``, so tests can find the pids in the log even when the server never
got as far as answering HTTP.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import ctypes.util
import hashlib
import itertools
import json
import math
import os
import platform
import random
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    # Imported where used at run time: the workers run this file as a script and
    # must start fast, without importing the `fakes` package (and verirl with it).
    from fakes._http import JSONHTTPServer, Request, Response

__all__ = [
    "FakeVLLMKnobs",
    "ServeArgs",
    "UsageError",
    "build_parser",
    "dev_mode_from_environ",
    "main",
    "make_http_server",
    "parse_args",
]

_WORKER_FLAG = "--verirl-worker"
_WORKER_READY_TIMEOUT = 30.0
_WORKER_STOP_TIMEOUT = 5.0
_PR_SET_PDEATHSIG = 1
_LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
_QUIET_LEVELS = ("warning", "error", "critical")
_PROTOCOLS = ("vllm", "trl-legacy")
_LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
_UVICORN_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
_TRL_WEIGHT_TRANSFER = '{"backend": "nccl"}'

_FAKE_VERSION = "0.0.0+fake"
_FINGERPRINT = f"vllm-{_FAKE_VERSION}"
_MAX_BODY = 4 * 1024 * 1024
_MAX_WORK = 500_000
_MAX_RECORDED_CALLS = 1000
_MAX_RECORDED_BODY = 64 * 1024
_MAX_RECORDED_PARAMS = 16
_MAX_RECORDED_QUERY = 256
_DEFAULT_MAX_MODEL_LEN = 32768
_DEFAULT_MAX_TOKENS = 16
_VOCAB_SIZE = 1 << 18  # prompt ids below it are accepted; generation uses the byte tokens
_BYTE_TOKENS = 256
_TOP_SAMPLED = 8
_LOGPROB_FLOOR = -9999.0
_IMAGE = "<image>"


def _str2bool(value: str) -> bool:
    """Parse a boolean the way transformers' ``HfArgumentParser`` does."""
    lowered = value.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    msg = f"Truthy value expected: got {value!r}; expected yes/no, true/false, t/f, y/n or 1/0"
    raise argparse.ArgumentTypeError(msg)


def _json_config(value: str) -> dict[str, Any] | None:
    """``--weight-transfer-config``: a JSON object, or ``null`` for none."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    if parsed is None or isinstance(parsed, dict):
        return parsed
    msg = f"a JSON object (or null) expected: got {value!r}"
    raise argparse.ArgumentTypeError(msg)


def _trl_weight_transfer() -> dict[str, Any] | None:
    return _json_config(_TRL_WEIGHT_TRANSFER)


@dataclass(frozen=True)
class ServeArgs:
    """The server's flags: trl ``vllm-serve``'s (with its defaults) and those TRL 1.x adds.

    The vLLM flags default to what ``trl.scripts.vllm_serve.build_command``
    passes, so a bare ``--model M`` is a server launched the TRL 1.x way.
    ``fake_protocol`` is this fake's own ``--fake-protocol`` (``None``: from
    ``FAKE_VLLM_PROTOCOL``).
    """

    model: str
    revision: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    host: str = "0.0.0.0"
    port: int = 8000
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    kv_cache_dtype: str = "auto"
    trust_remote_code: bool = False
    log_level: str = "info"
    vllm_model_impl: str = "vllm"
    distributed_executor_backend: str | None = None
    served_model_name: tuple[str, ...] | None = None
    weight_transfer_config: dict[str, Any] | None = field(default_factory=_trl_weight_transfer)
    logprobs_mode: str = "processed_logprobs"
    max_logprobs: int = -1
    enable_scale_out: bool = True
    uvicorn_log_level: str | None = None
    fake_protocol: str | None = None

    @property
    def world_size(self) -> int:
        """How many workers the server runs: tensor × data parallel size."""
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def served_names(self) -> tuple[str, ...]:
        """The model names requests may use (``--served-model-name``, else ``--model``)."""
        return self.served_model_name or (self.model,)


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser for the server's flags, each under both ``--a_b`` and ``--a-b``.

    Boolean flags behave as in ``HfArgumentParser``: ``--enforce_eager`` alone
    means true, ``--enforce_eager false`` means false; ``--no-enforce-eager``
    (vLLM's spelling) means false too.
    """
    parser = argparse.ArgumentParser(
        prog="python -m fakes.vllm_serve",
        description="Fake vLLM server (as TRL launches it) for tests: no GPU, no model, "
        "real processes.",
    )

    def add(name: str, *extra: str, **kwargs: Any) -> None:  # noqa: ANN401 - argparse's own signature
        spellings = [f"--{name}"]
        if "_" in name:
            spellings.append(f"--{name.replace('_', '-')}")
        parser.add_argument(*spellings, *extra, dest=name, **kwargs)

    def add_bool(name: str, default: bool | None) -> None:
        add(name, type=_str2bool, nargs="?", const=True, default=default, metavar="BOOL")
        negative = f"no_{name}"
        parser.add_argument(
            f"--{negative}", f"--{negative.replace('_', '-')}", dest=name, action="store_false"
        )

    parser.add_argument("model_tag", nargs="?", default=None, help="model, as in `vllm serve M`")
    add("model", default=None, help="model name or path (required unless given positionally)")
    add("revision", default=None)
    add("tensor_parallel_size", type=int, default=1)
    add("data_parallel_size", type=int, default=1)
    add("host", default="0.0.0.0", help="address to bind (trl's default: 0.0.0.0)")
    add("port", type=int, default=8000)
    add("gpu_memory_utilization", type=float, default=0.9)
    add("dtype", default="auto")
    add("max_model_len", type=int, default=None)
    add_bool("enable_prefix_caching", default=None)
    add_bool("enforce_eager", default=None)
    add("kv_cache_dtype", default="auto")
    add_bool("trust_remote_code", default=False)
    add("log_level", default="info")
    add("vllm_model_impl", "--model-impl", "--model_impl", default="vllm")
    add("distributed_executor_backend", default=None)
    add("served_model_name", nargs="+", default=None, metavar="NAME")
    add(
        "weight_transfer_config",
        type=_json_config,
        default=_trl_weight_transfer(),
        metavar="JSON",
        help=f"default (TRL's): {_TRL_WEIGHT_TRANSFER}; null for none",
    )
    add("logprobs_mode", choices=_LOGPROBS_MODES, default="processed_logprobs")
    add("max_logprobs", type=int, default=-1)
    add_bool("enable_scale_out", default=True)
    add("uvicorn_log_level", choices=_UVICORN_LEVELS, default=None)
    add(
        "fake_protocol",
        choices=_PROTOCOLS,
        default=None,
        help="the server to stand in for (default: $FAKE_VLLM_PROTOCOL, else vllm)",
    )
    return parser


class UsageError(Exception):
    """A flag `parse_args` rejects, when asked to raise instead of printing and exiting."""


def _raise_usage(message: str) -> NoReturn:
    raise UsageError(message)


def parse_args(argv: Sequence[str] | None = None, *, raise_errors: bool = False) -> ServeArgs:
    """Parse the flags; unknown or bad ones exit with status 2, as argparse does.

    With ``raise_errors``, they raise `UsageError` instead and nothing is
    printed (for a caller that is not this program, e.g. `FakeVLLMServer`).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"]:  # `vllm serve MODEL ...`
        words = words[1:]
    parser = build_parser()
    if raise_errors:
        parser.error = _raise_usage  # type: ignore[method-assign]
        parser._print_message = lambda message, file=None: None  # type: ignore[method-assign]  # noqa: ARG005, SLF001
        parser.exit = lambda status=0, message=None: _raise_usage(message or f"exit {status}")  # type: ignore[method-assign]
    values = vars(parser.parse_args(words))
    model_tag = values.pop("model_tag")
    values["model"] = model_tag if model_tag is not None else values["model"]
    if values["model"] is None:
        parser.error("the following arguments are required: --model")
    if values["served_model_name"] is not None:
        values["served_model_name"] = tuple(values["served_model_name"])
    return ServeArgs(**values)


def dev_mode_from_environ(environ: Mapping[str, str]) -> bool:
    """``VLLM_SERVER_DEV_MODE`` as vLLM reads it: an integer, non-zero means on.

    Unset or empty is off; anything else raises ``ValueError`` naming the variable.
    """
    raw = environ.get(_DEV_MODE_VAR, "").strip()
    try:
        return bool(int(raw)) if raw else False
    except ValueError:
        msg = f"{_DEV_MODE_VAR}={raw!r}: must be an integer (vLLM reads it with int())"
        raise ValueError(msg) from None


def _check_protocol(name: str, value: str) -> str:
    if value not in _PROTOCOLS:
        msg = f"{name}={value!r}: must be one of {', '.join(map(repr, _PROTOCOLS))}"
        raise ValueError(msg)
    return value


@dataclass(frozen=True)
class FakeVLLMKnobs:
    """The ``FAKE_VLLM_*`` environment variables, parsed (see the module docstring)."""

    startup_delay: float = 0.0
    crash_code: int | None = None
    crash_message: str = ""
    ignore_sigterm: bool = False
    worker_new_session: bool = False
    orphan_workers: bool = False
    shutdown_delay: float = 0.0
    load_until: str = ""
    protocol: str = "vllm"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FakeVLLMKnobs:
        """Read the knobs; a malformed value raises ``ValueError`` naming the variable."""

        def number(name: str) -> float:
            raw = environ.get(name, "").strip()
            try:
                return float(raw) if raw else 0.0
            except ValueError:
                msg = f"{name}={raw!r}: must be a number of seconds"
                raise ValueError(msg) from None

        def flag(name: str) -> bool:
            return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")

        crash_code: int | None = None
        crash_message = ""
        crash = environ.get("FAKE_VLLM_CRASH", "").strip()
        if crash:
            code, _, crash_message = crash.partition(":")
            try:
                crash_code = int(code)
            except ValueError:
                msg = f"FAKE_VLLM_CRASH={crash!r}: must look like 'code:message'"
                raise ValueError(msg) from None
        protocol = environ.get("FAKE_VLLM_PROTOCOL", "").strip() or "vllm"
        return cls(
            startup_delay=number("FAKE_VLLM_STARTUP_DELAY"),
            crash_code=crash_code,
            crash_message=crash_message,
            ignore_sigterm=flag("FAKE_VLLM_IGNORE_SIGTERM"),
            worker_new_session=flag("FAKE_VLLM_WORKER_NEW_SESSION"),
            orphan_workers=flag("FAKE_VLLM_ORPHAN_WORKERS"),
            shutdown_delay=number("FAKE_VLLM_SHUTDOWN_DELAY"),
            load_until=environ.get("FAKE_VLLM_LOAD_UNTIL", ""),
            protocol=_check_protocol("FAKE_VLLM_PROTOCOL", protocol),
        )


# ------------------------------------------------------------------ logging


def _log(message: str, level: str = "INFO") -> None:
    """A vLLM-looking log line on stdout (which `verirl.VLLMServer` sends to its log file)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [fake_vllm_serve] {message}", flush=True)  # noqa: T201 - a program's log


def _uvicorn(message: str) -> None:
    print(f"INFO:     {message}", flush=True)  # noqa: T201 - a program's log


def _error(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201 - a program's log


# ------------------------------------------------------------------ the fake model


def _encode(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="surrogatepass"))


def _decode(tokens: Iterable[int]) -> str:
    return bytes(token for token in tokens if token < _BYTE_TOKENS).decode("utf-8", "replace")


def _token_text(token: int) -> str:
    """One token on its own, as vLLM's detokenizer shows it ("" for a partial UTF-8 byte)."""
    return chr(token) if token < 0x80 else ""  # noqa: PLR2004 - ASCII


def _advance(digest: bytes, token: int) -> bytes:
    """The context after one more token."""
    return hashlib.blake2b(digest + token.to_bytes(4, "little"), digest_size=16).digest()


class _Distribution:
    """The fake model's next-token distribution at one context.

    The 256 byte tokens take ranks 1..256 in a permutation drawn from the
    context's digest, with geometric probabilities ``(1 - q) q**(rank - 1)``;
    any other id ``t`` ranks ``t + 1``, below them all.
    """

    __slots__ = ("_add", "_first", "_inverse", "_multiplier", "_step")

    def __init__(self, digest: bytes) -> None:
        bits = int.from_bytes(digest[:8], "little")
        self._multiplier = (bits & 0xFF) | 1
        self._inverse = pow(self._multiplier, -1, _BYTE_TOKENS)
        self._add = (bits >> 8) & 0xFF
        q = 0.5 + 0.45 * ((bits >> 16) & 0xFFFF) / 0xFFFF
        self._first = math.log1p(-q)
        self._step = math.log(q)

    def token(self, rank: int) -> int:
        return (self._multiplier * (rank - 1) + self._add) % _BYTE_TOKENS

    def rank(self, token: int) -> int:
        if token >= _BYTE_TOKENS:
            return token + 1
        return ((token - self._add) * self._inverse) % _BYTE_TOKENS + 1

    def logprob(self, rank: int) -> float:
        return max(self._first + (rank - 1) * self._step, _LOGPROB_FLOOR)

    def entries(self, token: int, others: int) -> list[tuple[int, float, int]]:
        """``(token, logprob, rank)``: ``token`` first, then the ``others`` best-ranked ones."""
        rank = self.rank(token)
        others = max(0, min(others, _BYTE_TOKENS - (rank <= _BYTE_TOKENS)))
        ranks = [r for r in range(1, others + 2) if r != rank][:others]
        return [(token, self.logprob(rank), rank)] + [
            (self.token(r), self.logprob(r), r) for r in ranks
        ]


@dataclass(frozen=True)
class _Step:
    token: int
    dist: _Distribution


@dataclass(frozen=True)
class _Sampling:
    n: int
    max_tokens: int
    greedy: bool
    seed: int | None


def _feed(digest: bytes, tokens: Sequence[int], dists: list[_Distribution] | None) -> bytes:
    """Advance over ``tokens``; collect the distributions the second one on was drawn from."""
    for index, token in enumerate(tokens):
        if dists is not None and index:
            dists.append(_Distribution(digest))
        digest = _advance(digest, token)
    return digest


def _sample(start: bytes, index: int, sampling: _Sampling) -> list[_Step]:
    """Choice ``index`` after the context ``start``: ``max_tokens`` byte tokens."""
    key = start + index.to_bytes(8, "little") + str(sampling.seed).encode()
    rng = random.Random(hashlib.blake2b(key, digest_size=16).digest())  # noqa: S311 - not crypto
    digest = start
    steps: list[_Step] = []
    for _ in range(sampling.max_tokens):
        dist = _Distribution(digest)
        token = dist.token(1 if sampling.greedy else rng.randint(1, _TOP_SAMPLED))
        steps.append(_Step(token, dist))
        digest = _advance(digest, token)
    return steps


def _key(token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else _token_text(token)


def _completion_logprobs(steps: Sequence[_Step], others: int, as_ids: bool) -> dict[str, Any]:
    offsets: list[int] = []
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top: list[dict[str, float]] = []
    offset = 0
    for step in steps:
        entries = step.dist.entries(step.token, others)
        key = _key(step.token, as_ids)
        offsets.append(offset)
        offset += len(key)
        tokens.append(key)
        token_logprobs.append(entries[0][1])
        listed: dict[str, float] = {}
        for token, logprob, _ in entries:  # the sampled token's own value wins a shared key
            listed.setdefault(_key(token, as_ids), logprob)
        top.append(listed)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top,
    }


def _chat_logprobs(steps: Sequence[_Step], top: int, *, as_ids: bool) -> dict[str, Any]:
    """OpenAI chat logprobs: the first ``top`` of (sampled, best others); -1: all."""
    content = []
    for step in steps:
        entries = step.dist.entries(step.token, _BYTE_TOKENS if top < 0 else top)
        listed = entries if top < 0 else entries[:top]
        content.append(
            {
                "token": _key(step.token, as_ids),
                "logprob": entries[0][1],
                "bytes": list(_token_text(step.token).encode()),
                "top_logprobs": [
                    {
                        "token": _key(token, as_ids),
                        "logprob": logprob,
                        "bytes": list(_key(token, as_ids).encode()),
                    }
                    for token, logprob, _ in listed
                ],
            }
        )
    return {"content": content}


def _generate_logprobs(steps: Sequence[_Step], others: int) -> dict[str, Any]:
    """The generate endpoint's logprobs as vLLM 0.32 sends them."""

    def entry(token: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"token_id": token, "logprob": logprob, "rank": rank}

    content = []
    for step in steps:
        entries = step.dist.entries(step.token, others)
        content.append(
            {
                **entry(*entries[0]),
                "top_logprobs": [entry(*item) for item in entries[: max(others, 1)]],
            }
        )
    return {"content": content}


def _prompt_logprobs(
    prompt: Sequence[int], dists: Sequence[_Distribution], others: int
) -> list[Any]:
    listed: list[Any] = [None]
    for token, dist in zip(prompt[1:], dists, strict=True):
        listed.append(
            {
                str(entry_token): {
                    "logprob": logprob,
                    "rank": rank,
                    "decoded_token": _token_text(entry_token),
                }
                for entry_token, logprob, rank in dist.entries(token, others)
            }
        )
    return listed


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


# ------------------------------------------------------------------ request checking


class _APIError(Exception):
    """An error answer in vLLM's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, status: int, message: str, *, kind: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


_NO_VALUE = object()


def _bad(message: str, param: str | None = None, value: object = _NO_VALUE) -> _APIError:
    """A 400 as vLLM's own checks word it (``message (parameter=p, value=v)``)."""
    if param is not None:
        message += f" (parameter={param}" + ("" if value is _NO_VALUE else f", value={value}") + ")"
    return _APIError(400, message, param=param)


def _summary(value: object) -> str:
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)[:100]


def _invalid(loc: str, kind: str, msg: str, value: object) -> _APIError:
    """A 400 as pydantic's validation words it (what vLLM sends for a malformed field)."""
    detail = {"type": kind, "loc": loc, "msg": msg, "input": _summary(value)}
    return _APIError(400, f"1 validation error:\n  {detail}", kind="Bad Request", param=loc)


def _server_error(message: str) -> _APIError:
    return _APIError(
        500,
        f"Call to collective_rpc method failed: Worker failed with error '{message}', "
        "please check the stack trace above for the root cause",
        kind="InternalServerError",
    )


def _json_object(request: Request, *, json_only: bool, required: bool) -> dict[str, Any]:
    if json_only:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise _APIError(
                400,
                "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                kind="Bad Request",
            )
    if not request.body.strip():
        if required:
            raise _invalid("body", "missing", "Field required", None)
        return {}
    try:
        value = json.loads(request.body)
    except (ValueError, RecursionError):
        raise _invalid("body", "json_invalid", "JSON decode error", {}) from None
    if not isinstance(value, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        raise _invalid("body", "model_attributes_type", msg, value)
    return value


def _required(
    body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], error: str, msg: str
) -> Any:  # noqa: ANN401 - a JSON value of the checked kind
    value = body.get(name)
    if value is None:
        raise _invalid(f"body.{name}", "missing", "Field required", value)
    if not isinstance(value, kind):
        raise _invalid(f"body.{name}", error, msg, value)
    return value


def _int(body: Mapping[str, Any], name: str, default: int | None, loc: str = "body.") -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "int_parsing" if isinstance(value, str) else "int_type"
        raise _invalid(loc + name, kind, "Input should be a valid integer", value)
    if isinstance(value, float):
        if not value.is_integer():
            msg = "Input should be a valid integer, got a number with a fractional part"
            raise _invalid(loc + name, "int_from_float", msg, value)
        return int(value)
    return value


def _float(body: Mapping[str, Any], name: str, default: float, loc: str = "body.") -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid(loc + name, "float_parsing", "Input should be a finite number", value)
    return float(value)


def _flag(body: Mapping[str, Any], name: str, loc: str = "body.") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _invalid(loc + name, "bool_type", "Input should be a valid boolean", value)
    return value


def _string(body: Mapping[str, Any], name: str, loc: str = "body.") -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _invalid(loc + name, "string_type", "Input should be a valid string", value)
    return value


def _token_ids(values: list[Any], loc: str) -> list[int]:
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(f"{loc}.{index}", "int_type", "Input should be a valid integer", value)
        if value < 0:
            msg = "Input should be greater than or equal to 0"
            raise _invalid(f"{loc}.{index}", "greater_than_equal", msg, value)
        if value >= _VOCAB_SIZE:
            raise _bad(f"Token id {value} is out of vocabulary")
    return values


def _prompts(value: object) -> list[list[int]]:
    """``prompt``: a string, strings, token ids, or lists of token ids."""
    if value is None or value == "":
        raise _bad("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(value, str):
        prompts = [_encode(value)]
    elif isinstance(value, list):
        if not value:
            raise _bad("You must pass at least one prompt")
        if all(isinstance(item, str) for item in value):
            prompts = [_encode(item) for item in value]
        elif all(isinstance(item, list) for item in value):
            prompts = [_token_ids(item, f"body.prompt.{i}") for i, item in enumerate(value)]
        else:
            prompts = [_token_ids(value, "body.prompt")]
    else:
        raise _invalid("body.prompt", "string_type", "Input should be a valid string", value)
    if not all(prompts):
        raise _bad("The decoder prompt cannot be empty")
    return prompts


def _render(messages: object) -> tuple[list[int], list[tuple[str, int]]]:
    """The fake chat template: ``(token ids, [(image hash, placeholder offset)])``."""
    if messages is None:
        raise _invalid("body.messages", "missing", "Field required", messages)
    if not isinstance(messages, list):
        raise _invalid("body.messages", "list_type", "Input should be a valid list", messages)
    if not messages:
        msg = "Cannot apply chat template to an empty conversation. Provide at least one message."
        raise _bad(msg)
    tokens: list[int] = []
    images: list[tuple[str, int]] = []
    for index, message in enumerate(messages):
        loc = f"body.messages.{index}"
        if not isinstance(message, dict):
            raise _invalid(loc, "dict_type", "Input should be a valid dictionary", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise _invalid(f"{loc}.role", "string_type", "Input should be a valid string", role)
        tokens += _encode(f"<|{role}|>\n")
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if parts is not None and not isinstance(parts, list):
            msg = "Input should be a valid string or list"
            raise _invalid(f"{loc}.content", "list_type", msg, content)
        for part in parts or ():
            tokens += _render_part(part, f"{loc}.content", len(tokens), images)
        tokens += _encode("\n")
    tokens += _encode("<|assistant|>\n")
    return tokens, images


def _render_part(part: object, loc: str, offset: int, images: list[tuple[str, int]]) -> list[int]:
    if not isinstance(part, dict):
        raise _invalid(loc, "dict_type", "Input should be a valid dictionary", part)
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise _invalid(f"{loc}.text", "string_type", "Input should be a valid string", text)
        return _encode(text)
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise _invalid(
                f"{loc}.image_url.url", "string_type", "Input should be a valid string", url
            )
        digest = hashlib.sha256(url.encode("utf-8", errors="surrogatepass")).hexdigest()
        images.append((digest, offset))
        return _encode(_IMAGE)
    msg = f"Unsupported chat content part type: {kind!r}. Supported types: image_url, text."
    raise _bad(msg, "type", kind)


def _features(images: Sequence[tuple[str, int]]) -> dict[str, Any] | None:
    if not images:
        return None
    return {
        "mm_hashes": {"image": [digest for digest, _ in images]},
        "mm_placeholders": {"image": [{"offset": o, "length": len(_IMAGE)} for _, o in images]},
        "kwargs_data": {
            "image": [
                base64.b64encode(b"verirl-fake-image:" + digest.encode()).decode()
                for digest, _ in images
            ]
        },
        "mm_metadata": None,
    }


def _is_str_lists(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(items, list) and all(isinstance(item, str) for item in items)
        for items in value.values()
    )


def _is_placeholder_lists(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(items, list)
        and all(
            isinstance(item, dict)
            and isinstance(item.get("offset"), int)
            and isinstance(item.get("length"), int)
            and item["offset"] >= 0
            and item["length"] > 0
            for item in items
        )
        for items in value.values()
    )


def _check_features(value: object, prompt_length: int) -> bytes:
    """Check ``features`` as vLLM's ``MultiModalFeatures`` does; return what steers generation."""
    if value is None:
        return b""
    loc = "body.features"
    if not isinstance(value, dict):
        raise _invalid(loc, "model_type", "Input should be a valid dictionary", value)
    hashes = value.get("mm_hashes")
    places = value.get("mm_placeholders")
    if not _is_str_lists(hashes):
        msg = "Input should be a dictionary of lists of strings"
        raise _invalid(f"{loc}.mm_hashes", "dict_type", msg, hashes)
    if not _is_placeholder_lists(places):
        msg = "Input should be a dictionary of lists of {offset >= 0, length > 0}"
        raise _invalid(f"{loc}.mm_placeholders", "dict_type", msg, places)
    assert isinstance(hashes, dict)  # noqa: S101 - narrowed above, for mypy
    assert isinstance(places, dict)  # noqa: S101
    problem = _features_problem(value, hashes, places, prompt_length)
    if problem:
        raise _invalid(loc, "value_error", f"Value error, {problem}", value)
    return "".join(digest for modality in sorted(hashes) for digest in hashes[modality]).encode()


def _features_problem(
    value: Mapping[str, Any],
    hashes: Mapping[str, list[str]],
    places: Mapping[str, list[dict[str, int]]],
    prompt_length: int,
) -> str | None:
    if set(hashes) != set(places):
        return "mm_hashes and mm_placeholders must use the same modalities"
    for name in ("kwargs_data", "mm_metadata"):
        extra = value.get(name)
        if extra is not None and (
            not isinstance(extra, dict)
            or set(extra) != set(hashes)
            or any(not isinstance(extra[m], list) or len(extra[m]) != len(hashes[m]) for m in extra)
        ):
            return f"{name} must use the same modalities and lengths as mm_hashes"
    ranges: list[tuple[int, int]] = []
    for modality in sorted(hashes):
        if len(hashes[modality]) != len(places[modality]):
            return f"{modality} mm_hashes and mm_placeholders must have the same length"
        ranges += [(p["offset"], p["offset"] + p["length"]) for p in places[modality]]
    ranges.sort()
    if any(after[0] < before[1] for before, after in itertools.pairwise(ranges)):
        return "mm_placeholders must be globally non-overlapping and sorted"
    if any(end > prompt_length for _, end in ranges):
        return "mm_placeholders must remain within the token_ids sequence"
    return None


# ------------------------------------------------------------------ HTTP

_Handler = Callable[["Request"], "Response"]


def _response(status: int, body: object = None) -> Response:
    from fakes._http import Response  # noqa: PLC0415 - see the TYPE_CHECKING import

    return Response(status, body)


def _query_bool(request: Request, name: str, default: bool) -> bool:
    raw = request.query_value(name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    msg = "Input should be a valid boolean, unable to interpret input"
    raise _invalid(f"query.{name}", "bool_parsing", msg, raw)


def _query_choice(request: Request, name: str, choices: Sequence[str]) -> str:
    raw = request.query_value(name)
    if raw is None:
        return choices[0]
    if raw not in choices:
        expected = " or ".join(repr(choice) for choice in choices)
        raise _invalid(f"query.{name}", "literal_error", f"Input should be {expected}", raw)
    return raw


class _FakeVLLMAPI:
    """vLLM's HTTP API over the fake model, with the weight-transfer state it checks."""

    def __init__(self, args: ServeArgs, *, dev_mode: bool, environ: Mapping[str, str]) -> None:
        self._args = args
        self._dev_mode = dev_mode
        self._environ = dict(environ)
        self._max_model_len = args.max_model_len or _DEFAULT_MAX_MODEL_LEN
        self._created = int(time.time())
        self._seed = hashlib.blake2b(
            b"verirl fake vLLM\0" + args.model.encode("utf-8", errors="surrogatepass"),
            digest_size=16,
        ).digest()
        self._lock = threading.Lock()
        self._calls: deque[dict[str, Any]] = deque(maxlen=_MAX_RECORDED_CALLS)
        self._updating = False
        self._paused = False
        self._weight_version = "default"

    def calls(self) -> list[dict[str, Any]]:
        """The recorded dev-mode POSTs, oldest first.

        Bodies are kept as bytes (at most ``_MAX_RECORDED_BODY`` of them) and
        parsed here, so that a small hostile body that parses into a large
        object costs memory only while it is being read back.
        """
        with self._lock:
            kept = list(self._calls)
        calls = []
        for call in kept:
            raw = call["raw_body"]
            body = None
            if raw.strip():
                with contextlib.suppress(ValueError, RecursionError):
                    body = json.loads(raw)
            calls.append({**{k: v for k, v in call.items() if k != "raw_body"}, "body": body})
        return calls

    def routes(self) -> dict[str, dict[str, _Handler]]:
        """Routes (path → method → handler) as this server's flags and environment register them."""
        get: dict[str, Callable[[Request], object]] = {
            "/version": lambda _: {"version": _FAKE_VERSION},
            "/v1/models": self._models,
        }
        post: dict[str, Callable[[Request], object]] = {
            "/v1/completions": self._completions,
            "/v1/chat/completions": self._chat,
            "/v1/chat/completions/render": self._render_chat,
            "/inference/v1/generate": self._generate,
        }
        if not self._args.enable_scale_out:
            for path in ("/v1/chat/completions/render", "/inference/v1/generate"):
                post[path] = self._scale_out_disabled
        recorded: dict[str, Callable[[Request], object]] = {}
        if self._dev_mode:
            get |= {
                "/server_info": self._server_info,
                "/get_world_size": self._world_size,
                "/is_paused": lambda _: {"is_paused": self._paused},
                "/weight_info": lambda _: {"weight_version": self._weight_version},
            }
            recorded = {
                "/reset_prefix_cache": lambda _: {"success": True},
                "/pause": self._pause,
                "/resume": self._resume,
                "/init_weight_transfer_engine": self._init_transfer,
                "/shutdown_weight_transfer_engine": lambda _: {
                    "message": "Weight transfer shut down"
                },
                "/start_weight_update": self._start_update,
                "/update_weights": self._update_weights,
                "/finish_weight_update": self._finish_update,
            }
        routes: dict[str, dict[str, _Handler]] = {
            "/health": {"GET": _constant(None)},
        }
        routes |= {path: {"GET": self._answer(handler)} for path, handler in get.items()}
        routes |= {path: {"POST": self._answer(handler)} for path, handler in post.items()}
        routes |= {path: {"POST": self._answer(h, record=True)} for path, h in recorded.items()}
        return routes

    def _answer(self, handler: Callable[[Request], object], *, record: bool = False) -> _Handler:
        def route(request: Request) -> Response:
            try:
                status, body = 200, handler(request)
            except _APIError as error:
                status, body = error.status, error.body()
            if record:
                self._record(request, status)
            return _response(status, body)

        return route

    def _record(self, request: Request, status: int) -> None:
        raw = request.body if len(request.body) <= _MAX_RECORDED_BODY else b""
        query = {
            name[:_MAX_RECORDED_QUERY]: values[-1][:_MAX_RECORDED_QUERY]
            for name, values in list(request.query.items())[:_MAX_RECORDED_PARAMS]
        }
        call = {"method": request.method, "path": request.path, "query": query, "raw_body": raw}
        with self._lock:
            self._calls.append({**call, "body_bytes": len(request.body), "status": status})

    # ------------------------------------------------ read-only endpoints

    def _models(self, _: Request) -> dict[str, Any]:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex[:16]}",
            "object": "model_permission",
            "created": self._created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        data = [
            {
                "id": name,
                "object": "model",
                "created": self._created,
                "owned_by": "vllm",
                "root": self._args.model,
                "parent": None,
                "max_model_len": self._max_model_len,
                "permission": [permission],
            }
            for name in self._args.served_names
        ]
        return {"object": "list", "data": data}

    def _config(self) -> dict[str, Any]:
        args = self._args
        names = args.served_names
        return {
            "model_config": {
                "model": args.model,
                "tokenizer": args.model,
                "served_model_name": names[0] if len(names) == 1 else list(names),
                "revision": args.revision,
                "dtype": args.dtype,
                "max_model_len": self._max_model_len,
                "trust_remote_code": args.trust_remote_code,
                "enforce_eager": bool(args.enforce_eager),
                "max_logprobs": args.max_logprobs,
                "logprobs_mode": args.logprobs_mode,
                "model_impl": args.vllm_model_impl,
                "seed": 0,
            },
            "cache_config": {
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "cache_dtype": args.kv_cache_dtype,
                "enable_prefix_caching": args.enable_prefix_caching is not False,
            },
            "parallel_config": {
                "pipeline_parallel_size": 1,
                "tensor_parallel_size": args.tensor_parallel_size,
                "data_parallel_size": args.data_parallel_size,
                "world_size": args.tensor_parallel_size,
                "distributed_executor_backend": args.distributed_executor_backend,
            },
            "device_config": "cpu",
            "weight_transfer_config": args.weight_transfer_config,
            "instance_id": "verirl-fake",
        }

    def _server_info(self, request: Request) -> dict[str, Any]:
        config_format = _query_choice(request, "config_format", ("text", "json"))
        config = self._config()
        vllm_config: object = config
        if config_format == "text":
            flat = {**config.pop("model_config"), **config}
            vllm_config = ", ".join(f"{name}={value!r}" for name, value in flat.items())
        return {
            "vllm_config": vllm_config,
            "vllm_env": {
                name: value
                for name, value in self._environ.items()
                if name.startswith("VLLM_") and "KEY" not in name
            },
            "system_env": {
                "fake": "verirl fakes.vllm_serve",
                "python_version": platform.python_version(),
                "os": sys.platform,
            },
        }

    def _world_size(self, request: Request) -> dict[str, int]:
        with_dp = _query_bool(request, "include_dp", default=True)
        return {"world_size": self._args.world_size if with_dp else self._args.tensor_parallel_size}

    # ------------------------------------------------ dev-mode POSTs

    def _pause(self, request: Request) -> dict[str, str]:
        _query_choice(request, "mode", ("abort", "wait", "keep"))
        _query_bool(request, "clear_cache", default=True)
        self._paused = True
        return {"status": "paused"}

    def _resume(self, _: Request) -> dict[str, str]:
        self._paused = False
        return {"status": "resumed"}

    def _init_transfer(self, request: Request) -> dict[str, str]:
        body = _json_object(request, json_only=False, required=False)
        _required(body, "init_info", dict, "dict_type", "Input should be a valid dictionary")
        if self._args.weight_transfer_config is None:
            raise _server_error(
                "no weight transfer engine: the server was started without --weight-transfer-config"
            )
        return {"message": "Weight transfer initialized"}

    def _start_update(self, _: Request) -> dict[str, str]:
        with self._lock:
            if self._updating:
                raise _server_error(
                    "start_weight_update called while a weight update is already active. "
                    "Call finish_weight_update first."
                )
            self._updating = True
        return {"message": "Weight update started"}

    def _update_weights(self, request: Request) -> dict[str, str]:
        body = _json_object(request, json_only=False, required=False)
        msg = "Input should be a valid dictionary or list of dictionaries"
        info = _required(body, "update_info", (dict, list), "dict_type", msg)
        if isinstance(info, list) and not all(isinstance(item, dict) for item in info):
            raise _invalid("body.update_info", "dict_type", msg, info)
        with self._lock:
            if not self._updating:
                raise _server_error("start_weight_update must be called before update_weights.")
        return {"message": "Weights updated"}

    def _finish_update(self, request: Request) -> dict[str, str]:
        body = _json_object(request, json_only=False, required=False)
        version = _string(body, "weight_version")
        with self._lock:
            if not self._updating:
                raise _server_error(
                    "finish_weight_update called without a matching start_weight_update."
                )
            self._updating = False
            if version is not None:
                self._weight_version = version
        return {"message": "Weight update finished"}

    # ------------------------------------------------ generation

    def _scale_out_disabled(self, _: Request) -> NoReturn:
        raise _APIError(
            403,
            "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
            "enable them.",
            kind="PermissionDeniedError",
        )

    def _model(self, body: Mapping[str, Any]) -> str:
        """The model a request names (checked), or the first served name."""
        model = _string(body, "model")
        names = self._args.served_names
        if not model:
            return names[0]
        if model not in names:
            raise _APIError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                kind="NotFoundError",
                param="model",
            )
        return model

    def _sampling(
        self, body: Mapping[str, Any], *, loc: str = "body.", max_names: Sequence[str] = ()
    ) -> _Sampling:
        n = _int(body, "n", 1, loc) or 0
        if n < 1:
            raise _bad(f"n must be at least 1, got {n}.")
        max_tokens = None
        for name in (*max_names, "max_tokens"):
            max_tokens = _int(body, name, None, loc)
            if max_tokens is not None:
                break
        max_tokens = _DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        if max_tokens < 1:
            raise _bad(
                f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
            )
        if max_tokens > self._max_model_len:
            raise _bad(
                f"max_tokens={max_tokens} cannot be greater than "
                f"max_model_len={self._max_model_len}. Please request fewer output tokens.",
                "max_tokens",
                max_tokens,
            )
        temperature = _float(body, "temperature", 1.0, loc)
        if temperature < 0:
            msg = f"temperature must be non-negative, got {temperature}."
            raise _bad(msg, "temperature", temperature)
        greedy = temperature < 1e-5  # noqa: PLR2004 - vLLM's _SAMPLING_EPS
        if greedy and n > 1:
            raise _bad(f"n must be 1 when using greedy sampling, got {n}.")
        return _Sampling(n, max_tokens, greedy, _int(body, "seed", None, loc))

    def _logprob_count(self, value: int | None, name: str, what: str = "sample") -> int | None:
        """How many alternatives ``logprobs=value`` asks for (``None``: no logprobs)."""
        if value is None:
            return None
        if value < -1:
            raise _bad(f"`{name}` must be a positive value or -1.", name, value)
        count = _VOCAB_SIZE if value == -1 else value
        limit = _VOCAB_SIZE if self._args.max_logprobs == -1 else self._args.max_logprobs
        if count > limit:
            raise _bad(
                f"Requested {what} logprobs of {count}, which is greater than max allowed: {limit}",
                name,
                count,
            )
        return count

    def _charge(self, work: int) -> None:
        if work > _MAX_WORK:
            raise _bad(
                f"this request asks the fake vLLM server for {work} tokens and logprob entries; "
                f"it answers at most {_MAX_WORK} per request (lower n, max_tokens or logprobs)"
            )

    def _completions(self, request: Request) -> dict[str, Any]:
        body = _json_object(request, json_only=True, required=True)
        model = self._model(body)
        prompts = _prompts(body.get("prompt"))
        sampling = self._sampling(body)
        others = self._logprob_count(_int(body, "logprobs", None), "logprobs")
        prompt_others = self._logprob_count(
            _int(body, "prompt_logprobs", None), "prompt_logprobs", "prompt"
        )
        return_ids = _flag(body, "return_token_ids")
        as_ids = _flag(body, "return_tokens_as_token_ids")
        if _flag(body, "stream"):
            raise _bad("the fake vLLM server does not stream", "stream")
        per_token = 1 if others is None else 2 + min(others, _BYTE_TOKENS)
        prompt_cost = 2 + (0 if prompt_others is None else 2 + min(prompt_others, _BYTE_TOKENS))
        self._charge(
            sum(len(p) * (prompt_cost + sampling.n) for p in prompts)
            + len(prompts) * sampling.n * sampling.max_tokens * per_token
        )
        choices: list[dict[str, Any]] = []
        for prompt in prompts:
            dists: list[_Distribution] | None = None if prompt_others is None else []
            start = _feed(self._seed, prompt, dists)
            prompt_lps = (
                None if dists is None else _prompt_logprobs(prompt, dists, prompt_others or 0)
            )
            for index in range(sampling.n):
                steps = _sample(start, index, sampling)
                tokens = [step.token for step in steps]
                choices.append(
                    {
                        "index": len(choices),
                        "text": _decode(tokens),
                        "logprobs": None
                        if others is None
                        else _completion_logprobs(steps, others, as_ids),
                        "finish_reason": "length",
                        "stop_reason": None,
                        "token_ids": tokens if return_ids else None,
                        "prompt_logprobs": prompt_lps,
                        "prompt_token_ids": list(prompt) if return_ids else None,
                        "routed_experts": None,
                    }
                )
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": _FINGERPRINT,
            "usage": _usage(sum(map(len, prompts)), len(choices) * sampling.max_tokens),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _chat_request(self, body: Mapping[str, Any]) -> tuple[list[int], bytes, list[Any]]:
        tokens, images = _render(body.get("messages"))
        return tokens, "".join(digest for digest, _ in images).encode(), images

    def _chat(self, request: Request) -> dict[str, Any]:
        body = _json_object(request, json_only=True, required=True)
        model = self._model(body)
        prompt, steer, _ = self._chat_request(body)
        sampling = self._sampling(body, max_names=("max_completion_tokens",))
        wants_logprobs = _flag(body, "logprobs")
        top = _int(body, "top_logprobs", None)
        if top is not None and top < -1:
            raise _bad("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        if top is not None and (top == -1 or top > 0) and not wants_logprobs:
            raise _bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        top = (top or 0) if wants_logprobs else None
        self._logprob_count(top, "logprobs")
        return_ids = _flag(body, "return_token_ids")
        as_ids = _flag(body, "return_tokens_as_token_ids")
        if _flag(body, "stream"):
            raise _bad("the fake vLLM server does not stream", "stream")
        width = 0 if top is None else 2 + (_BYTE_TOKENS if top < 0 else min(top, _BYTE_TOKENS))
        self._charge(2 * len(prompt) + sampling.n * sampling.max_tokens * (1 + width))
        start = _feed(_seed_with(self._seed, steer), prompt, None)
        choices = []
        for index in range(sampling.n):
            steps = _sample(start, index, sampling)
            tokens = [step.token for step in steps]
            message = {
                "role": "assistant",
                "content": _decode(tokens),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": None if top is None else _chat_logprobs(steps, top, as_ids=as_ids),
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": tokens if return_ids else None,
                    "routed_experts": None,
                }
            )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": _FINGERPRINT,
            "usage": _usage(len(prompt), sampling.n * sampling.max_tokens),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if return_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _render_chat(self, request: Request) -> dict[str, Any]:
        body = _json_object(request, json_only=True, required=True)
        model = self._model(body)
        prompt, _, images = self._chat_request(body)
        sampling = self._sampling(body, max_names=("max_completion_tokens",))
        self._charge(len(prompt))
        sampling_params = {
            "presence_penalty": _float(body, "presence_penalty", 0.0),
            "frequency_penalty": _float(body, "frequency_penalty", 0.0),
            "repetition_penalty": _float(body, "repetition_penalty", 1.0),
            "temperature": _float(body, "temperature", 1.0),
            "top_p": _float(body, "top_p", 1.0),
            "min_p": _float(body, "min_p", 0.0),
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": sampling.max_tokens,
            "output_kind": 2,
            "skip_clone": True,
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        }
        return {
            "request_id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "token_ids": prompt,
            "token_offsets": None,
            "features": _features(images),
            "content_parts": None,
            "sampling_params": sampling_params,
            "model": model,
            "reasoning_ended": None,
            "reasoning_parser_kwargs": None,
            "return_token_ids": None,
            "output_mode": "tokens",
            "stream": False,
            "stream_options": None,
            "cache_salt": None,
            "priority": 0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
        }

    def _generate(self, request: Request) -> dict[str, Any]:
        body = _json_object(request, json_only=True, required=True)
        model = self._model(body)
        prompt = _required(body, "token_ids", list, "list_type", "Input should be a valid list")
        if not prompt:
            msg = "List should have at least 1 item after validation, not 0"
            raise _invalid("body.token_ids", "too_short", msg, prompt)
        prompt = _token_ids(prompt, "body.token_ids")
        params = _required(
            body, "sampling_params", dict, "dict_type", "Input should be a valid dictionary"
        )
        sampling = self._sampling(params, loc="body.sampling_params.")
        others = self._logprob_count(
            _int(params, "logprobs", None, "body.sampling_params."), "logprobs"
        )
        steer = _check_features(body.get("features"), len(prompt))
        mode = body.get("output_mode", "tokens")
        if mode not in ("tokens", "text"):
            msg = "Input should be 'tokens' or 'text'"
            raise _invalid("body.output_mode", "literal_error", msg, mode)
        request_id = _string(body, "request_id") or uuid.uuid4().hex[:16]
        return_ids = _flag(body, "return_token_ids")
        if _flag(body, "stream"):
            raise _bad("the fake vLLM server does not stream", "stream")
        width = 0 if others is None else 2 + min(others, _BYTE_TOKENS)
        self._charge(2 * len(prompt) + sampling.n * sampling.max_tokens * (1 + width))
        start = _feed(_seed_with(self._seed, steer), prompt, None)
        choices = []
        for index in range(sampling.n):
            steps = _sample(start, index, sampling)
            tokens = [step.token for step in steps]
            choice: dict[str, Any] = {
                "index": index,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": tokens,
                "routed_experts": None,
                "sampling_mask": None,
                "weight_versions": [
                    {"version": self._weight_version, "start": 0, "end": len(tokens)}
                ],
            }
            if mode == "text":
                choice["text"] = _decode(tokens)
                top = None if others is None else max(others, 1)
                choice["logprobs"] = (
                    None if top is None else _chat_logprobs(steps, top, as_ids=False)
                )
            else:
                choice["logprobs"] = None if others is None else _generate_logprobs(steps, others)
            choices.append(choice)
        features = body.get("features")
        return {
            "request_id": f"generate-tokens-{request_id}",
            "model": model,
            "created": int(time.time()),
            "usage": _usage(len(prompt), sampling.n * sampling.max_tokens),
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": prompt if return_ids else None,
            "mm_placeholders": features["mm_placeholders"] if return_ids and features else None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": mode,
            "choices": choices,
        }


def _seed_with(seed: bytes, steer: bytes) -> bytes:
    return hashlib.blake2b(seed + steer, digest_size=16).digest() if steer else seed


def _legacy_routes(args: ServeArgs) -> dict[str, dict[str, _Handler]]:
    """TRL 0.2x's ``trl vllm-serve`` (FastAPI): its read-only endpoints, slash-terminated."""
    bodies = {
        "/health/": {"status": "ok"},
        "/get_world_size/": {"world_size": args.world_size},
        "/get_tensor_parallel_size/": {"tensor_parallel_size": args.tensor_parallel_size},
    }
    return {path: {"GET": _constant(body)} for path, body in bodies.items()}


def _constant(body: object) -> _Handler:
    def route(_: Request) -> Response:
        return _response(200, body)

    return route


def make_http_server(
    host: str,
    port: int,
    *,
    world_size: int | None = None,
    tensor_parallel_size: int | None = None,
    args: ServeArgs | None = None,
    protocol: str = "vllm",
    dev_mode: bool = False,
    environ: Mapping[str, str] | None = None,
    extra_routes: Mapping[str, Callable[[], object]] | None = None,
    private_routes: Sequence[str] = (),
    access_log: bool = False,
) -> JSONHTTPServer:
    """Bind the fake server's HTTP API on ``host:port``; the caller serves it.

    ``args`` are the server's flags (default: model ``fake/model`` and the
    given ``world_size`` = ``tensor_parallel_size`` × data parallel size, the
    tensor parallel size defaulting to the whole world); ``protocol`` is
    ``"vllm"`` or ``"trl-legacy"``; ``dev_mode`` registers vLLM's
    ``VLLM_SERVER_DEV_MODE`` endpoints; ``environ`` is what ``/server_info``
    reports. ``extra_routes`` maps more GET paths to functions returning a
    JSON-able body; ``private_routes`` among them answer only loopback
    clients. Raises ``OSError`` if the address is taken, ``ValueError`` for a
    bad ``protocol`` or sizes.
    """
    from fakes._http import bind_json_server  # noqa: PLC0415 - see the TYPE_CHECKING import

    _check_protocol("protocol", protocol)
    if args is None:
        tp = tensor_parallel_size or world_size or 1
        world = world_size or tp
        if tp < 1 or world % tp:
            msg = f"world_size={world} is not a multiple of tensor_parallel_size={tp}"
            raise ValueError(msg)
        args = ServeArgs(
            model="fake/model", tensor_parallel_size=tp, data_parallel_size=world // tp
        )
    elif world_size is not None or tensor_parallel_size is not None:
        raise ValueError("pass either args or world_size/tensor_parallel_size")
    api = _FakeVLLMAPI(args, dev_mode=dev_mode, environ=os.environ if environ is None else environ)
    routes = api.routes() if protocol == "vllm" else _legacy_routes(args)
    private = frozenset(private_routes)

    def extra(path: str, body: Callable[[], object]) -> _Handler:
        def route(request: Request) -> Response:
            if path in private and request.client_host not in _LOOPBACK:
                return _response(403, {"detail": "loopback clients only"})
            return _response(200, body())

        return route

    for path, body in {
        "/verirl/calls/": lambda: {"calls": api.calls()},
        **(extra_routes or {}),
    }.items():
        routes[path] = {"GET": extra(path, body)}
    internal_error = _APIError(500, "Internal Server Error", kind="InternalServerError").body()
    return bind_json_server(
        host,
        port,
        routes,
        max_body=_MAX_BODY,
        access_log=_uvicorn if access_log else None,
        internal_error=internal_error if protocol == "vllm" else None,
    )


# ------------------------------------------------------------------ processes


def _set_death_signal(sig: int, expected_parent: int) -> None:
    """Ask Linux to send ``sig`` when the parent dies; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)


class _Shutdown(BaseException):
    """Raised by the SIGTERM/SIGINT handler to unwind into the graceful shutdown."""


def _install_shutdown_handlers(ignore_sigterm: bool) -> None:
    def on_signal(signum: int, _frame: object) -> NoReturn:
        # A second signal during shutdown is ignored: the first one is being handled.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _uvicorn(f"Received {signal.Signals(signum).name}; shutting down")
        raise _Shutdown

    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _start_workers(count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` worker processes and wait until each has set itself up."""
    read_fd, write_fd = os.pipe()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(count):
            argv = [sys.executable, str(Path(__file__).resolve()), _WORKER_FLAG, str(rank)]
            argv += [str(write_fd), str(os.getpid())]
            workers.append(subprocess.Popen(argv, pass_fds=(write_fd,)))
        os.close(write_fd)
        write_fd = -1
        _await_workers(read_fd, count)
    except BaseException:
        _stop_workers(workers)
        raise
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    return workers


def _await_workers(read_fd: int, count: int) -> None:
    """Read one byte per worker from the pipe they were handed; fail if they never come."""
    ready = 0
    deadline = time.monotonic() + _WORKER_READY_TIMEOUT
    while ready < count:
        left = deadline - time.monotonic()
        readable, _, _ = select.select([read_fd], [], [], max(left, 0.0))
        chunk = os.read(read_fd, 64) if readable else b""
        if not chunk:
            msg = f"only {ready} of {count} workers started"
            raise RuntimeError(msg)
        ready += len(chunk)


def _stop_workers(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=_WORKER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        _log(f"Worker process [{worker.pid}] exited with {worker.returncode}")


def _worker_main(argv: Sequence[str]) -> int:
    """One engine worker: announce itself, then idle until signalled."""
    rank, ready_fd, parent = (int(value) for value in argv)
    knobs = FakeVLLMKnobs.from_environ(os.environ)
    if not knobs.orphan_workers:
        _set_death_signal(signal.SIGTERM, parent)
    if knobs.worker_new_session:
        os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN if knobs.ignore_sigterm else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server coordinates Ctrl-C
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    _log(f"Started worker process [{os.getpid()}] rank={rank} CUDA_VISIBLE_DEVICES={cuda}")
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    while True:
        time.sleep(3600)


def _start_without_signals(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGTERM/SIGINT blocked in it, so the kernel hands them to main.

    The main thread's sleep is what they must interrupt: one that lands on another
    thread (e.g. sent while the process was stopped) would wait for main to wake up.
    """
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)


def _load_until(path: str) -> None:
    """Keep "loading" until ``path`` exists (no-op for ``""``); a signal still ends it."""
    delay = 0.005
    while path and not Path(path).exists():
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _serve_main(args: ServeArgs, argv: Sequence[str]) -> int:
    try:
        knobs = FakeVLLMKnobs.from_environ(os.environ)
        dev_mode = dev_mode_from_environ(os.environ)
    except ValueError as exc:
        _error(f"error: {exc}")
        return 2
    protocol = args.fake_protocol or knobs.protocol
    _install_shutdown_handlers(knobs.ignore_sigterm)
    _log(f"vLLM API server version {_FAKE_VERSION} (verirl fakes.vllm_serve: no GPU, no model)")
    _log(f"Started server process [{os.getpid()}]")
    _log(f"non-default args: {json.dumps(asdict(args))}")
    _log(f"fake protocol: {protocol}; {_DEV_MODE_VAR}={int(dev_mode)}")
    workers: list[subprocess.Popen[bytes]] = []
    httpd: JSONHTTPServer | None = None
    thread: threading.Thread | None = None
    try:
        workers = _start_workers(args.world_size)
        if knobs.crash_code is not None:
            _error(knobs.crash_message)
            return knobs.crash_code  # a crash: the workers are left to fend for themselves
        _log(f"Loading model {args.model} (fake: {knobs.startup_delay:g}s)")
        time.sleep(knobs.startup_delay)
        _load_until(knobs.load_until)
        _log("Model loading took 0.00 GiB and 0.000000 seconds")
        level = (args.uvicorn_log_level or args.log_level).lower()
        try:
            httpd = make_http_server(
                args.host,
                args.port,
                args=args,
                protocol=protocol,
                dev_mode=dev_mode,
                environ=os.environ,
                extra_routes={
                    "/verirl/argv/": lambda: {"argv": list(argv)},
                    "/verirl/args/": lambda: asdict(args),
                    "/verirl/workers/": lambda: {"pids": [w.pid for w in workers]},
                    "/verirl/env/": lambda: {"env": dict(os.environ)},
                },
                private_routes=("/verirl/env/",),
                access_log=level not in _QUIET_LEVELS,
            )
        except OSError as exc:
            _error(
                f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"({args.host!r}, {args.port}): {exc.strerror}"
            )
            return 1
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        _start_without_signals(thread)
        _uvicorn("Waiting for application startup.")
        _uvicorn("Application startup complete.")
        _uvicorn(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
        while True:
            time.sleep(3600)
    except _Shutdown:
        _uvicorn("Shutting down")
        with contextlib.suppress(_Shutdown):  # a signal that raced the handler's SIG_IGN
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
            if thread is not None:
                thread.join(timeout=_WORKER_STOP_TIMEOUT)
            _stop_workers(workers)
            time.sleep(knobs.shutdown_delay)
        _uvicorn(f"Finished server process [{os.getpid()}]")
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake server (or, internally, one of its workers); return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_WORKER_FLAG]:
        return _worker_main(args[1:])
    return _serve_main(parse_args(args), args)


if __name__ == "__main__":
    sys.exit(main())
