"""Property-based: every public constructor and CLI flag, fed arbitrary values.

The properties (issue 9):

- the only exceptions that escape are verirl errors (`VeriRLError` subclasses);
- a `ConfigError` names the field, variable or flag it is about (its ``field``
  attribute, when set, is one of the inputs and appears in the message) and
  shows the offending value; a token never appears anywhere;
- what is accepted is usable: a URL built from accepted settings parses, an
  accepted number is the number written, an accepted token is a valid header;
- the CLI returns an int exit code and never prints a traceback; a bad flag
  exits 2 naming the flag (``--gpus``), not the Python field (``gpu_count``).

Nothing here starts a server, writes outside ``tmp_path`` or connects anywhere
but loopback: an audit hook refuses (and the test reports) any other
connection. Examples are derandomized and no example database is written, so
a failure reproduces on every run.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import math
import os
import re
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import verirl
from _support import command_flags
from fakes import FakeEnvServer
from verirl import (
    Checkpoint,
    CheckpointResolver,
    ConfigError,
    DistributedEnv,
    EnvServerUnavailable,
    HttpEnvServerProbe,
    HubCheckpointSource,
    LocalCheckpointSource,
    Settings,
    TrainingRuntime,
    VeriRLError,
    VLLMServer,
    VLLMTopology,
    resolver_from_settings,
    topology_from_settings,
)
from verirl._secrets import redact_message, redact_url
from verirl.cli import build_parser, main

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

SECRET = "hf_SECRETtoken"
"""Every generated token starts with this; it must never be shown."""

# ---------------------------------------------------------------- loopback only

_guard: dict[str, Any] = {"on": False, "violations": []}


def _loopback(host: object) -> bool:
    if host is None or host in ("", b"", "localhost", b"localhost"):
        return True
    text = host.decode() if isinstance(host, bytes) else str(host)
    try:
        return ipaddress.ip_address(text.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _guard["on"]:
        return
    host = None
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event in ("socket.connect", "socket.sendto") and isinstance(args[1], tuple):
        host = args[1][0]
    else:
        return
    if not _loopback(host):
        _guard["violations"].append(f"{event} {host!r}")
        raise ConnectionRefusedError(f"test guard: {host!r} is not loopback")


sys.addaudithook(_audit)


@contextmanager
def loopback_only() -> Iterator[None]:
    _guard["on"], _guard["violations"] = True, []
    try:
        yield
    finally:
        _guard["on"] = False
    assert _guard["violations"] == [], "tried to reach beyond loopback"


# ---------------------------------------------------------------- sandbox


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, HOME and the temp dir inside tmp_path; no verirl/HF settings; Hub offline; no torch.

    GPUs are counted from ``CUDA_VISIBLE_DEVICES`` as on a machine without
    torch, whether or not this environment has one (or one that cannot load).
    """
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in list(os.environ):
        if name.startswith(("VERIRL_", "HF_", "HUGGING_FACE_")) or name in (
            "CUDA_VISIBLE_DEVICES",
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)
    for sub in ("cwd", "home", "tmp"):
        (tmp_path / sub).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with loopback_only():
        yield tmp_path


@contextmanager
def environ_restored() -> Iterator[None]:
    """The CLI's launch applies the distributed env to os.environ; undo it per example."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def closed_port():
    """A loopback port bound but not listening: connections are refused, nobody else gets it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# ---------------------------------------------------------------- values

SPECIAL_TEXT = [
    "",
    " ",
    "\t",
    "\n",
    "\x00",
    "a\x00b",
    "x\n",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1",
    "0",
    "1",
    "2",
    "8",
    "1_0",
    "٣",  # ARABIC-INDIC DIGIT THREE
    "１",  # FULLWIDTH DIGIT ONE
    "99999999999999999999",
    "0x10",
    " 2 ",
    "2\n",
    "1.5",
    "latest",
    "last-checkpoint",
    "~",
    "~/run",
    "~nouser/x",
    ".",
    "..",
    "a" * 300,
    "[::1]",
    "http://x",
    "org/run",
    "-x",
    "--",
    "'x",
]

texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(max_size=30))
# Bounded: a plan allocates per GPU, and counts between ~1e6 and 2**60 would
# exhaust memory before any check could matter. The huge ones fail at once.
ints = st.one_of(
    st.integers(-5, 10_000),
    st.sampled_from([2**62, 2**63, 2**64, 10**30, -(10**30), 65535, 65536, 70000]),
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, 1e30, math.inf, -math.inf, math.nan]),
)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.binary(max_size=5))
anything = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.tuples(scalars),
    st.dictionaries(texts, scalars, max_size=3),
    st.builds(object),
)


# URLs that parse, on loopback hosts only, with whatever after them (query, fragment, path).
url_tails = st.one_of(
    st.sampled_from(["", "/", "/p", "?q=1", "#f", "/p?q#f", "/%00", "/ /", "/\n"]),
    st.builds(lambda t: "/" + t, texts),
)
urls = st.builds(
    lambda scheme, host, port, tail: f"{scheme}://{host}{port}{tail}",
    st.sampled_from(["http", "https", "HTTP", "ftp"]),
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", " ", "u:p@127.0.0.1", "127.0.0.1 "]),
    st.sampled_from(["", ":9", ":0", ":65536", ":x", ":-1"]),
    url_tails,
)


def kwargs_of(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A few keyword arguments (at most three), so that one bad value does not hide the others."""
    return st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=3).flatmap(
        lambda names: st.fixed_dictionaries({name: fields[name] for name in names})
    )


def given_only(kwargs: Mapping[str, object]) -> dict[str, object]:
    """Settings helpers read ``None`` as "not given": it is no input to name."""
    return {name: value for name, value in kwargs.items() if value is not None}


# ---------------------------------------------------------------- the error property


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w])", text) is not None


def _renderings(value: object) -> list[str]:
    out = [repr(value), str(value), type(value).__name__]
    if isinstance(value, str):
        out += [repr(value.strip()), value.strip(), os.path.expanduser(value)]  # noqa: PTH111
        if value.strip() and "\x00" not in value:
            out += [str(Path(value)), repr(str(Path(value)))]
            out += [os.path.expanduser(str(Path(value)))]  # noqa: PTH111 - Path's raises for ~nouser
        if re.fullmatch(r"\s*[0-9]+\s*", value):
            out.append(str(int(value)))  # "007" shown as 7 is shown
        if re.fullmatch(r"\s*[0-9.eE+-]+\s*", value):
            with contextlib.suppress(ValueError):
                out.append(str(float(value)))  # a number of seconds, shown as parsed
        if "@" in value:  # what looks like URL credentials is shown redacted
            out += [redact_url(value), repr(redact_url(value))]
        # ... and so is what looks like a secret parameter ("Pass=0": the value of pass=)
        out += [redact_message(value), repr(redact_message(value))]
    if isinstance(value, Mapping):
        out += [repr(k) for k in value] + [str(k) for k in value]
    if isinstance(value, (list, tuple)):
        out += [repr(item) for item in value]
    return [item for item in out if item.strip()]


def shows(value: object, message: str) -> bool:
    """The message shows the value (a long one may be cut, so its first 60 characters do)."""
    return any(text[:60] in message for text in _renderings(value))


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text, f"a token leaked: {text!r}"


def check_config_error(
    exc: ConfigError,
    inputs: Mapping[str, object],
    *,
    secret_fields: tuple[str, ...] = (),
    also: tuple[str, ...] = (),
) -> None:
    """The message names the input it is about and shows that input's value."""
    message = str(exc)
    assert_no_secret(message, repr(exc.value))
    known = [*inputs, *also]
    if exc.field is not None:
        assert exc.field in known, (
            f"ConfigError.field={exc.field!r} is none of the inputs {sorted(inputs)}: {message!r}"
        )
        assert _named(exc.field, message), f"field {exc.field!r} not in {message!r}"
    named = [name for name in known if _named(name, message)]
    assert named, f"names none of {sorted(inputs)}: {message!r}"
    culprit = exc.field if exc.field in inputs else next((n for n in named if n in inputs), None)
    if culprit is not None and culprit not in secret_fields:
        assert shows(inputs[culprit], message), (
            f"does not show {culprit}={inputs[culprit]!r}: {message!r}"
        )


_FAILED = object()


def attempt(
    build: Callable[[], Any],
    inputs: Mapping[str, object],
    *,
    secret_fields: tuple[str, ...] = (),
    also: tuple[str, ...] = (),
) -> Any:
    """``build()``; a verirl error is checked and turned into `_FAILED`, anything else escapes."""
    try:
        return build()
    except ConfigError as exc:
        check_config_error(exc, inputs, secret_fields=secret_fields, also=also)
    except VeriRLError as exc:
        assert_no_secret(str(exc))
    return _FAILED


def assert_url_parses(
    url: str, host: str | None = None, port: int | None = None, *, with_port: bool = True
) -> None:
    """An accepted setting must not make a URL that does not parse (or points elsewhere)."""
    parts = urlsplit(url)
    assert parts.scheme in ("http", "https"), url
    assert parts.hostname, url
    assert parts.port is not None or not with_port, url
    if host is not None:
        assert parts.hostname == host.strip("[]").lower(), (url, host)
    if port is not None:
        assert parts.port == port, (url, port)
    assert not parts.query, url
    assert not parts.fragment, url


def canonical_int(text: str) -> bool:
    return re.fullmatch(r"[0-9]+", text.strip()) is not None


# ---------------------------------------------------------------- HttpEnvServerProbe

probe_kwargs = kwargs_of(
    health_path=st.one_of(texts, anything),
    request_timeout=st.one_of(floats, ints, anything),
    session=anything,
    backoff=anything,
    progress_every=st.one_of(floats, anything),
)


@PROPERTY
@given(url=st.one_of(urls, texts, anything), kwargs=probe_kwargs)
def test_probe_construction(sandbox, url, kwargs):
    probe = attempt(lambda: HttpEnvServerProbe(url, **kwargs), {"url": url, **kwargs})
    if probe is not _FAILED:
        assert_url_parses(probe.health_url, with_port=False)


@PROPERTY
@given(
    suffix=st.one_of(st.just(""), st.builds(lambda t: "/" + t, texts)),
    kwargs=probe_kwargs,
    timeout=st.one_of(
        st.floats(min_value=-1, max_value=0.05), st.sampled_from([math.nan, -math.inf]), anything
    ),
)
def test_probe_against_a_closed_port_never_raises_from_check_and_times_out(
    sandbox, closed_port, suffix, kwargs, timeout
):
    """``check()`` never raises; ``wait(small)`` raises `EnvServerUnavailable` or ConfigError."""
    url = f"http://127.0.0.1:{closed_port}{suffix}"
    probe = attempt(lambda: HttpEnvServerProbe(url, **kwargs), {"url": url, **kwargs})
    if probe is _FAILED:
        return
    assert probe.check() is False
    if isinstance(timeout, (int, float)) and timeout > 1:
        return  # never wait long in a property test
    try:
        probe.wait(timeout)
    except EnvServerUnavailable:
        pass
    except ConfigError as exc:
        check_config_error(exc, {"timeout": timeout})
    else:
        pytest.fail(f"wait({timeout!r}) returned for a closed port")


@PROPERTY
@given(request_timeout=st.one_of(floats, ints))
def test_an_accepted_request_timeout_reports_a_healthy_server_healthy(sandbox, request_timeout):
    with FakeEnvServer() as server:
        probe = attempt(
            lambda: HttpEnvServerProbe(server.url, request_timeout=request_timeout),
            {"request_timeout": request_timeout},
        )
        # A tiny budget may honestly run out on a loaded machine; 2 s and more must not.
        if probe is not _FAILED and probe.request_timeout >= 2.0:
            assert probe.check() is True, f"request_timeout={request_timeout!r} accepted"


# ---------------------------------------------------------------- VLLMTopology.plan


@PROPERTY
@given(
    gpu_count=st.one_of(ints, anything),
    kwargs=kwargs_of(
        max_model_len=st.one_of(ints, anything),
        mode=st.one_of(st.sampled_from(["auto", "server", "colocate", "AUTO", " auto"]), anything),
        vllm_gpus=st.one_of(ints, anything),
        tensor_parallel_size=st.one_of(ints, anything),
        data_parallel_size=st.one_of(ints, anything),
        gpu_memory_utilization=st.one_of(floats, anything),
        host=st.one_of(texts, anything),
        port=st.one_of(ints, anything),
        remote_host=st.one_of(texts, anything),
        server_timeout=st.one_of(floats, anything),
    ),
)
def test_topology_plan(sandbox, gpu_count, kwargs):
    kwargs.setdefault("max_model_len", 4096)
    topology = attempt(
        lambda: VLLMTopology.plan(gpu_count, **kwargs), {"gpu_count": gpu_count, **kwargs}
    )
    if topology is _FAILED:
        return
    topology.grpo_kwargs()
    topology.describe()
    assert topology.gpu_count == gpu_count
    if topology.server_url is not None:
        assert_url_parses(topology.server_url, port=topology.port)
        if topology.remote_host is not None:
            assert_url_parses(topology.server_url, host=topology.remote_host)


# ---------------------------------------------------------------- DistributedEnv

DIST_NAMES = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "PYTORCH_CUDA_ALLOC_CONF",
]
int_texts = st.one_of(texts, st.integers(-3, 70000).map(str), ints.map(str))


@PROPERTY
@given(
    environ=st.dictionaries(st.one_of(st.sampled_from(DIST_NAMES), texts), int_texts, max_size=6),
    kwargs=kwargs_of(master_port=st.one_of(ints, anything), avoid_ports=anything),
)
def test_distributed_env_single_node(sandbox, environ, kwargs):
    dist = attempt(
        lambda: DistributedEnv.single_node(environ=environ, **kwargs),
        {**environ, **kwargs},
    )
    if dist is _FAILED:
        return
    variables = dist.variables
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in variables.items())
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        assert canonical_int(variables[name]), f"{name}={variables[name]!r} accepted"
    assert int(variables["RANK"]) < int(variables["WORLD_SIZE"]), variables
    assert int(variables["LOCAL_RANK"]) < int(variables["LOCAL_WORLD_SIZE"]), variables
    assert 1 <= int(variables["MASTER_PORT"]) <= 65535, variables


# ---------------------------------------------------------------- VLLMServer (never started)


@PROPERTY
@given(
    model=st.one_of(texts, anything),
    kwargs=kwargs_of(
        port=st.one_of(ints, anything),
        host=st.one_of(texts, anything),
        devices=st.one_of(st.lists(ints, max_size=3), st.tuples(ints), anything),
        max_model_len=st.one_of(ints, anything),
        gpu_memory_utilization=st.one_of(floats, anything),
        tensor_parallel_size=st.one_of(ints, anything),
        data_parallel_size=st.one_of(ints, anything),
        extra_args=st.one_of(st.lists(texts, max_size=3), anything),
        command=st.one_of(st.lists(texts, max_size=3), anything),
        env=st.one_of(st.dictionaries(texts, texts, max_size=3), anything),
        log_path=st.one_of(texts, anything),
        startup_timeout=st.one_of(floats, anything),
        shutdown_timeout=st.one_of(floats, anything),
        progress_interval=st.one_of(floats, anything),
        handle_sigterm=anything,
    ),
)
def test_vllm_server_construction(sandbox, model, kwargs):
    server = attempt(lambda: VLLMServer(model, **kwargs), {"model": model, **kwargs})
    if server is _FAILED:
        return
    repr(server)
    assert server.model.strip(), f"model={model!r} accepted"
    assert_url_parses(server.base_url, port=server.port)
    # What start() would hand to Popen: a NUL anywhere is a bare ValueError there.
    spawned = [*server.serve_args, *(server.command or ()), *server.env, *server.env.values()]
    assert not any("\x00" in item for item in spawned), f"NUL accepted: {spawned!r}"
    if server.log_path is not None:
        assert "\x00" not in str(server.log_path)


# ---------------------------------------------------------------- checkpoints


@PROPERTY
@given(step=st.one_of(ints, anything), path=st.one_of(texts, anything), source=anything)
def test_checkpoint(sandbox, step, path, source):
    attempt(lambda: Checkpoint(step, path, source), {"step": step, "path": path, "source": source})


@PROPERTY
@given(root=st.one_of(texts, anything))
def test_local_checkpoint_source(sandbox, root):
    source = attempt(lambda: LocalCheckpointSource(root), {"root": root})
    if source is _FAILED:
        return
    assert source.root == Path(os.path.expanduser(root)), f"root={root!r} not expanded"  # noqa: PTH111
    result = attempt(source.latest, {"root": root})
    assert result is None or result is _FAILED


@PROPERTY
@given(
    repo_id=st.one_of(st.sampled_from(["org/run", "a/b", "run"]), texts, anything),
    download_dir=st.one_of(st.sampled_from(["dl", "~/dl", "./dl/"]), texts, anything),
    kwargs=kwargs_of(
        token=st.one_of(st.builds(lambda t: SECRET + t, texts), anything),
        revision=st.one_of(st.sampled_from(["main", "v1"]), texts, anything),
        endpoint=st.one_of(urls, texts, anything),
        timeout=st.one_of(floats, anything),
        max_workers=st.one_of(ints, anything),
    ),
)
def test_hub_checkpoint_source_construction(sandbox, repo_id, download_dir, kwargs):
    source = attempt(
        lambda: HubCheckpointSource(repo_id, download_dir=download_dir, **kwargs),
        {"repo_id": repo_id, "download_dir": download_dir, **kwargs},
        secret_fields=("token",),
    )
    if source is _FAILED:
        return
    assert_no_secret(repr(source), str(source))
    assert source.download_dir == Path(os.path.expanduser(download_dir)), "~ not expanded"  # noqa: PTH111
    token = kwargs.get("token")
    if isinstance(token, str) and token:
        # Sent as "Authorization: Bearer <token>": it must be a valid header value.
        assert not re.search(r"[\x00-\x1f\x7f]", token), "a token with control characters"
        assert token == token.strip(), "a token with surrounding whitespace"
        token.encode("latin-1")
    if source.endpoint is not None:
        assert_url_parses(source.endpoint, with_port=False)


local_source = st.builds(lambda: LocalCheckpointSource("empty"))


@PROPERTY
@given(
    sources=st.one_of(
        st.lists(st.one_of(local_source, anything), max_size=3),
        anything,
    ),
    request=st.one_of(texts, anything),
)
def test_checkpoint_resolver(sandbox, sources, request):
    (sandbox / "cwd" / "empty").mkdir(exist_ok=True)
    names: dict[str, object] = {"sources": sources}
    if isinstance(sources, (list, tuple, dict, str)):
        names |= {f"sources[{i}]": s for i, s in enumerate(sources)}
    resolver = attempt(lambda: CheckpointResolver(sources), names)
    if resolver is _FAILED:
        resolver = CheckpointResolver([LocalCheckpointSource("empty")])
    path = attempt(lambda: resolver.resolve(request), {"request": request})
    if path is not _FAILED and path is not None:
        assert isinstance(path, str)
        assert Path(path).is_dir()
    from_env = attempt(
        lambda: resolver.resolve_from_env({"VERIRL_RESUME_FROM_CHECKPOINT": request}),
        {"VERIRL_RESUME_FROM_CHECKPOINT": request},
    )
    assert from_env is _FAILED or from_env is None or Path(from_env).is_dir()


# ---------------------------------------------------------------- settings

SETTINGS = [
    "VERIRL_ENV_SERVER_URL",
    "VERIRL_MODEL",
    "VERIRL_MAX_MODEL_LEN",
    "VERIRL_OUTPUT_DIR",
    "VERIRL_HUB_REPO_ID",
    "HF_TOKEN",
    "VERIRL_HUB_ENDPOINT",
    "VERIRL_HUB_REVISION",
    "VERIRL_GPU_COUNT",
    "VERIRL_VLLM_MODE",
    "VERIRL_VLLM_GPUS",
    "VERIRL_VLLM_PORT",
    "VERIRL_VLLM_HOST",
    "VERIRL_VLLM_COMMAND",
    "VERIRL_VLLM_LOG_DIR",
    "VERIRL_RESUME_FROM_CHECKPOINT",
    "VERIRL_ENV_TIMEOUT",
    "CUDA_VISIBLE_DEVICES",
]
NUMERIC = ["VERIRL_MAX_MODEL_LEN", "VERIRL_GPU_COUNT", "VERIRL_VLLM_GPUS", "VERIRL_VLLM_PORT"]


def setting_value(name: str) -> st.SearchStrategy[str]:
    if name == "HF_TOKEN":
        return st.builds(lambda t: SECRET + t, texts)
    if name in ("VERIRL_ENV_SERVER_URL", "VERIRL_HUB_ENDPOINT"):
        # A URL that parses points at loopback (nothing here connects anyway).
        return st.one_of(urls, texts)
    if name == "VERIRL_GPU_COUNT":
        return st.one_of(texts, st.integers(0, 16).map(str))
    return st.one_of(texts, ints.map(str))


settings_environ = st.lists(st.sampled_from(SETTINGS), unique=True, max_size=8).flatmap(
    lambda names: st.fixed_dictionaries({name: setting_value(name) for name in names})
)


def check_settings_result(environ: Mapping[str, str], topology: VLLMTopology) -> None:
    """Accepted numeric variables are plain decimal numbers and mean what they say."""
    fields = {
        "VERIRL_GPU_COUNT": topology.gpu_count,
        "VERIRL_MAX_MODEL_LEN": None,  # capped in colocate mode
        "VERIRL_VLLM_PORT": topology.port,
    }
    for name in NUMERIC:
        raw = environ.get(name, "").strip()
        if raw:
            assert canonical_int(raw), f"{name}={environ[name]!r} accepted"
            if fields.get(name) is not None:
                assert fields[name] == int(raw), f"{name}={environ[name]!r} -> {fields[name]}"
    if topology.server_url is not None:
        assert_url_parses(topology.server_url)


def two_gpus_unless_given(environ: dict[str, str]) -> dict[str, str]:
    """No GPU here: without either variable the plan fails (see the fixed example below)."""
    if not environ.get("VERIRL_GPU_COUNT", "").strip() and "CUDA_VISIBLE_DEVICES" not in environ:
        return {**environ, "VERIRL_GPU_COUNT": "2"}
    return environ


@PROPERTY
@given(environ=settings_environ.map(two_gpus_unless_given))
def test_runtime_from_settings(sandbox, environ):
    runtime = attempt(
        lambda: TrainingRuntime.from_settings(environ=environ),
        environ,
        secret_fields=("HF_TOKEN",),
        also=("VERIRL_GPU_COUNT",),
    )
    if runtime is _FAILED:
        return
    assert_no_secret(repr(runtime))
    check_settings_result(environ, runtime.topology)
    url = environ.get("VERIRL_ENV_SERVER_URL", "").strip()
    if url and runtime.env_probe is not None:
        assert_url_parses(runtime.env_probe.url, with_port=False)
    timeout = runtime.env_timeout
    assert math.isfinite(timeout), f"env_timeout={timeout!r} accepted"
    assert timeout >= 0
    resume = environ.get("VERIRL_RESUME_FROM_CHECKPOINT", "").strip()
    if resume:
        # A resume request is never dropped: it needs somewhere to be resolved.
        assert runtime.checkpoints is not None, f"resume request {resume!r} dropped"


topology_kwargs = kwargs_of(
    gpu_count=st.one_of(ints, anything),
    max_model_len=st.one_of(ints, anything),
    mode=st.one_of(texts, anything),
    vllm_gpus=st.one_of(ints, anything),
    vllm_port=st.one_of(ints, anything),
    vllm_remote_host=st.one_of(texts, anything),
)


@PROPERTY
@given(kwargs=topology_kwargs, environ=settings_environ.map(two_gpus_unless_given))
def test_topology_from_settings(sandbox, kwargs, environ):
    topology = attempt(
        lambda: topology_from_settings(**kwargs, environ=environ),
        {**given_only(kwargs), **environ},
        secret_fields=("HF_TOKEN",),
        also=("VERIRL_GPU_COUNT",),
    )
    if topology is _FAILED:
        return
    check_settings_result({k: v for k, v in environ.items() if k not in NUMERIC}, topology)
    if kwargs.get("gpu_count") is not None:
        assert topology.gpu_count == kwargs["gpu_count"]


@PROPERTY
@given(
    kwargs=kwargs_of(
        output_dir=st.one_of(texts, anything),
        hub_repo_id=st.one_of(texts, st.just("org/run"), anything),
        hub_token=st.one_of(st.builds(lambda t: SECRET + t, texts), anything),
        hub_endpoint=st.one_of(urls, texts),
        hub_revision=st.one_of(texts, anything),
    ),
    environ=settings_environ,
)
def test_resolver_from_settings(sandbox, kwargs, environ):
    resolver = attempt(
        lambda: resolver_from_settings(**kwargs, environ=environ),
        {**given_only(kwargs), **environ},
        secret_fields=("HF_TOKEN", "hub_token"),
    )
    if resolver is not _FAILED:
        assert_no_secret(repr(resolver))


def _any_setting_value(name: str) -> st.SearchStrategy[str]:
    if name == "HF_TOKEN":
        return st.builds(lambda t: SECRET + t, texts)
    return st.one_of(texts, ints.map(str), floats.map(str), urls)


every_setting_environ = st.lists(
    st.sampled_from(sorted(Settings.variables().values())), unique=True, max_size=10
).flatmap(lambda names: st.fixed_dictionaries({n: _any_setting_value(n) for n in names}))


@PROPERTY
@given(environ=every_setting_environ)
def test_settings_from_environ(sandbox, environ):
    """Every declared variable, any text: typed settings or a ConfigError naming the variable."""
    settings_ = attempt(
        lambda: Settings.from_environ(environ), environ, secret_fields=("HF_TOKEN",)
    )
    if settings_ is _FAILED:
        return
    assert_no_secret(repr(settings_))
    for field, variable in Settings.variables().items():
        value = getattr(settings_, field)
        if not environ.get(variable, "").strip():
            assert value is None, f"{variable} unset or blank gave {field}={value!r}"
        elif isinstance(value, float):
            assert math.isfinite(value), f"{variable}={environ[variable]!r} -> {value!r}"
            assert value >= 0, f"{variable}={environ[variable]!r} -> {value!r}"
        elif isinstance(value, int):
            assert canonical_int(environ[variable].strip()), f"{variable}={environ[variable]!r}"


def test_every_public_constructor_is_driven():
    """A new public class or classmethod needs a property here too."""
    driven = {
        "Checkpoint",
        "CheckpointResolver",
        "DistributedEnv",
        "HttpEnvServerProbe",
        "HubCheckpointSource",
        "LocalCheckpointSource",
        "Settings",
        "TrainingRuntime",
        "VLLMServer",
        "VLLMTopology",
        "resolver_from_settings",
        "topology_from_settings",
    }
    not_driven = {
        # errors, protocols, results built by verirl itself, and helpers without inputs
        *(name for name in verirl.__all__ if name.endswith("Error") or "Exited" in name),
        "EnvServerUnavailable",
        "VLLMServerUnavailable",
        "VLLMServerUnresponsive",
        "VLLMStartupTimeout",
        "CheckpointSource",
        "CheckpointResolving",
        "EnvServerProbe",
        "ServerHandle",
        "ServerTopology",
        "ServerFactory",
        "LaunchPlan",
        "Backoff",  # the probes' schedule, exported for signatures; tested in test_envserver
        "PhaseTiming",
        "RuntimeSession",
        "__version__",
        "detect_gpu_count",
        "find_free_port",
    }
    assert set(verirl.__all__) - not_driven == driven


# ---------------------------------------------------------------- the CLI

# A value argparse would take for an option ("-x") is a different error; negative numbers stay.
cli_text = st.one_of(
    texts.filter(lambda t: not t.startswith("-") or re.fullmatch(r"-\d+", t) is not None),
    ints.map(str),
)
NUMERIC_FLAGS = ("--gpus", "--max-model-len", "--vllm-gpus", "--vllm-port",
                 "--tensor-parallel-size", "--data-parallel-size")  # fmt: skip
SERVE_ONLY = ("--host", "--tensor-parallel-size", "--data-parallel-size")
# Short waits only (a closed port is waited on until the timeout); "inf" would hang.
cli_seconds = st.one_of(
    st.floats(min_value=-1, max_value=0.05).map(lambda x: f"{x:.4f}"),
    st.sampled_from(["nan", "NaN", "x", "", " ", "0", "1e-9", "٠", "-1", "0x1"]),
)
URL_FLAGS = ("--env-url", "--hub-endpoint")


def _not_a_url(text: str) -> bool:
    return "://" not in text


def flag_values(flag: str, closed_url: str) -> st.SearchStrategy[str]:
    """Arbitrary values, except that a URL that parses is loopback and a wait is short."""
    if flag in URL_FLAGS:
        return st.one_of(
            cli_text.filter(_not_a_url),
            st.just(closed_url),
            st.builds(lambda t: f"{closed_url}/{t}", texts),
        )
    if "timeout" in flag:
        return cli_seconds
    special = {
        "--mode": st.sampled_from(["auto", "server", "colocate"]),
        "--hub-repo": st.just("org/run"),
        "--resume": st.sampled_from(["latest", "last-checkpoint", "", "."]),
        "--gpus": st.sampled_from(["1", "2", "4"]),
    }
    if flag in special:
        return st.one_of(special[flag], cli_text)
    return cli_text


def cli_pairs(
    draw_from: st.DataObject, command: str, closed_url: str, *, exclude: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    flags = [flag for flag in command_flags(command) if flag not in exclude]
    return draw_from.draw(
        st.lists(
            st.sampled_from(flags).flatmap(
                lambda f: st.tuples(st.just(f), flag_values(f, closed_url))
            ),
            max_size=4,
        )
    )


COMMON = st.lists(st.sampled_from(["--json", "-v", "-q"]), max_size=2)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with environ_restored():
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors, --help
            code = exc.code
    out, err = capsys.readouterr()
    assert isinstance(code, int), f"exit code {code!r}"
    assert "Traceback" not in out + err, err
    assert_no_secret(out, err)
    return code, out, err


def check_cli(
    command: str, code: int, err: str, pairs: list[tuple[str, str]], positional: dict[str, str]
) -> None:
    """Exit 2 names a flag of the command (as typed), not the Python field; and its value.

    Exit 0: every number given was written as a plain decimal number.
    """
    if code == 0:
        for flag, value in pairs:
            if flag in NUMERIC_FLAGS:
                assert canonical_int(value), f"{flag} {value!r} accepted"
    if code != 2:
        return
    # the error's own words: a flag given twice has a WARNING of its own, naming it
    err = "\n".join(line for line in err.splitlines() if " WARNING " not in line)
    known = [*command_flags(command), *positional]
    named = [name for name in known if _named(name, err)]
    assert named, f"exit 2 names no flag of {command} (given: {pairs}, {positional}): {err!r}"
    given_values = [*pairs, *positional.items()]
    shown = [value for name, value in given_values if name in named and shows(value, err)]
    assert shown or not any(name in named for name, _ in given_values), f"value not shown: {err!r}"


@pytest.fixture
def cli_sandbox(sandbox, monkeypatch, closed_port):
    """Two GPUs as far as verirl can tell (no torch here), unless a flag says otherwise."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    return f"http://127.0.0.1:{closed_port}"


def test_every_cli_command_is_driven():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # serve runs a server until a signal: its flags are the topology and server flags of launch,
    # driven there, and the serving node's own, driven by test_cli_serve with no server able to run.
    assert set(sub.choices) == {"plan", "wait-env", "resume", "doctor", "launch", "serve"}
    assert set(command_flags("serve")) - set(SERVE_ONLY) <= set(command_flags("launch"))


@PROPERTY
@given(data=st.data(), common=COMMON)
def test_cli_plan(cli_sandbox, capsys, data, common):
    pairs = cli_pairs(data, "plan", cli_sandbox)
    code, _out, err = run_cli(capsys, ["plan", *common, *(x for pair in pairs for x in pair)])
    check_cli("plan", code, err, pairs, {})


@PROPERTY
@given(data=st.data(), common=COMMON)
def test_cli_wait_env(cli_sandbox, capsys, data, common):
    url = data.draw(
        st.one_of(
            cli_text.filter(_not_a_url),
            st.just(cli_sandbox),
            st.builds(lambda t: f"{cli_sandbox}/{t}", texts),
        )
    )
    pairs = cli_pairs(data, "wait-env", cli_sandbox)
    if "--timeout" not in dict(pairs):
        pairs.append(("--timeout", "0.01"))
    argv = ["wait-env", *common, *(x for pair in pairs for x in pair), "--", url]
    code, _out, err = run_cli(capsys, argv)
    assert code in (2, 3), (code, err)
    check_cli("wait-env", code, err, pairs, {"url": url})


@PROPERTY
@given(data=st.data(), common=COMMON)
def test_cli_resume(cli_sandbox, capsys, data, common):
    pairs = cli_pairs(data, "resume", cli_sandbox)
    code, _out, err = run_cli(capsys, ["resume", *common, *(x for pair in pairs for x in pair)])
    check_cli("resume", code, err, pairs, {})


@PROPERTY
@given(data=st.data(), common=COMMON)
def test_cli_doctor(cli_sandbox, capsys, data, common):
    pairs = cli_pairs(data, "doctor", cli_sandbox)
    code, _out, err = run_cli(capsys, ["doctor", *common, *(x for pair in pairs for x in pair)])
    # doctor is a preflight (issue #26): 3 env server, 4 no vLLM launch here, 1 torch/token.
    assert code in (0, 1, 2, 3, 4), (code, err)
    assert (code in (0, 2)) or "not usable: " in err, (code, err)
    check_cli("doctor", code, err, pairs, {})


def _vllm_commands(tmp: Path) -> st.SearchStrategy[str]:
    """Commands that can never run anything: unparseable, empty, or a program that is not there."""
    missing = str(tmp / "no-such-vllm-serve")
    return st.one_of(
        st.sampled_from(["'x", '"', "", " ", "a'b"]),
        st.builds(lambda t: f"{missing} {t}", texts),
    )


@PROPERTY
@given(data=st.data())
def test_cli_launch(cli_sandbox, capsys, sandbox, data):
    """Parse and start-up errors: the command is ``true`` and no server can start.

    ``--vllm-host`` is left out: a remote server is waited for, up to 15 minutes.
    """
    pairs = cli_pairs(data, "launch", cli_sandbox, exclude=("--vllm-host", "--vllm-command"))
    # Always given, so that the installed trl (if any) is never started.
    pairs.append(("--vllm-command", data.draw(_vllm_commands(sandbox))))
    if "--env-url" in dict(pairs) and "--env-timeout" not in dict(pairs):
        pairs.append(("--env-timeout", "0.01"))  # without a URL, --env-timeout is refused
    for flag, value in pairs:
        if flag == "--log-dir":
            assume(not value.startswith(("/", "~")) and ".." not in value)  # stay inside tmp
    argv = ["launch", *(x for pair in pairs for x in pair), "--", "true"]
    code, _out, err = run_cli(capsys, argv)
    check_cli("launch", code, err, pairs, {})


@PROPERTY
@given(data=st.data(), dedicated=st.booleans())
def test_cli_serve(cli_sandbox, capsys, sandbox, data, dedicated):
    """The serving node's flags (and --gpus): no server can start, so serve ends at once."""
    flags = [*SERVE_ONLY, "--gpus"]
    pairs = data.draw(
        st.lists(
            st.sampled_from(flags).flatmap(
                lambda f: st.tuples(st.just(f), flag_values(f, cli_sandbox))
            ),
            max_size=3,
        )
    )
    pairs.append(("--vllm-command", data.draw(_vllm_commands(sandbox))))
    argv = ["serve", "--model", "m", *(["--dedicated"] if dedicated else []),
            *(x for pair in pairs for x in pair)]  # fmt: skip
    code, _out, err = run_cli(capsys, argv)
    assert code in (2, 4), err
    check_cli("serve", code, err, pairs, {})


# ---------------------------------------------------------------- fixed examples


def test_no_gpu_detected_names_the_setting_to_give(sandbox):
    """Nothing set and no GPU found: the message says which variable (or flag) to set."""
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(environ={"CUDA_VISIBLE_DEVICES": "-1"})
    assert "VERIRL_GPU_COUNT" in str(info.value)


def test_cli_no_gpu_detected_names_the_flag(sandbox, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    code, _out, err = run_cli(capsys, ["plan"])
    assert code == 2
    assert "--gpus" in err
    assert "gpu_count" not in err
