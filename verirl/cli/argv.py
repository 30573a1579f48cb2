"""The command line read before argparse: flags whose values start with ``--``, secrets.

Each refusal names the flag and never shows a secret's value.
"""

from __future__ import annotations

import argparse
import functools
import logging
import re
import shlex
from collections.abc import Iterator, Sequence

from verirl import __version__
from verirl._cli_document import command_word, wants_json, write_document
from verirl._cli_output import STDERR, STDOUT
from verirl._fs import printable
from verirl._hidden import HIDDEN
from verirl._secrets import redact_argv, shown_line, taken_out
from verirl.cli.codes import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from verirl.cli.output import _RUN_SECRETS, _error_document, _for_stdout, _hidden, _read_run_secrets
from verirl.cli.parser import _PARSE_OUTPUT, _REPEATED

log = logging.getLogger("verirl")


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--vllm-args --enforce-eager`` as ``--vllm-args=--enforce-eager`` (before any ``--``).

    argparse takes a value that starts with ``-`` for a flag; the values of
    ``--vllm-args`` are flags by nature.
    """
    joined: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            joined += argv[index:]
            break
        following = argv[index + 1] if index + 1 < len(argv) else None
        if (
            arg == "--vllm-args"
            and following is not None
            and following.startswith("-")
            and following != "--"  # the command's separator: the value was forgotten
        ):
            joined.append(f"{arg}={following}")
            index += 2
            continue
        joined.append(arg)
        index += 1
    return joined


def _refuse_a_split_vllm_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--vllm-args --dtype float32 -- COMMAND``: a usage error, not ``float32 -- COMMAND`` run.

    ``--vllm-args`` takes one value; the words after it (its value's other
    words, or verirl's own flags) up to the ``--`` were taken for the command,
    run after the whole server start-up, and the server failed first (exit 4).
    So a value of one word that is a flag (``--vllm-args --dtype`` or
    ``--vllm-args=--dtype``), with a command that does not start at the ``--``
    but holds one, is that mistake, or a command given without ``--``: either
    way ``--`` just before the command says which. A value of several words
    was given whole: the words after it are the command. (A secret's flag
    alone: `_refuse_a_lone_secret_flag`.) Nothing given is echoed but through
    `redact_argv`.
    """
    command = getattr(args, "command", None) or []
    flag = str(getattr(args, "vllm_args", None) or "").strip()
    if not flag.startswith("-") or any(char.isspace() for char in flag):
        return  # none, or given whole
    target = _subcommand_parser(parser, args.cmd)
    if not command or command[0] == "--" or "--" not in command:
        return
    words = command[: command.index("--")]
    own = next(
        (i for i, word in enumerate(words) if _option(target, word.partition("=")[0]) is not None),
        len(words),
    )
    try:
        line = shlex.join([*shlex.split(flag), *words[:own]])
        example = shlex.quote(redact_argv([line])[0])  # the line's secrets hidden in it
    except ValueError:  # an unbalanced quote: no example that a shell would give back as it is
        example = "'...'"
    theirs = f" with verirl's own {shown_line(words[own:])} before it" if own < len(words) else ""
    target.error(
        "argument --vllm-args: it takes one value, and the words after it, before '--', "
        "would be taken for the command: put '--' just before the command; if those words are "
        f"the server's, give its whole value in one word, --vllm-args={printable(example)}"
        f"{theirs}"
    )


def _refuse_a_lone_secret_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``--vllm-args --api-key KEY``: a usage error before the parse, the key never shown.

    ``--vllm-args`` takes one value; a secret's flag alone there, or last in it
    (``--vllm-args='--enforce-eager --api-key' KEY``), left its value to the
    next word: launch's command (its program), or, for serve, an
    "unrecognized argument" that argparse's error quoted. However spelled
    (``=`` or not, abbreviated), before the command's ``--``. Nothing of the
    value is shown but that flag's name.
    """
    target = _subcommand_parser(parser, command_word(argv))
    given = [(arg, next_word, rest) for arg, found, next_word, rest in _own_flags(parser, argv)
             if found is not None and found.dest == "vllm_args"]  # fmt: skip
    for arg, next_word, rest in given[-1:]:  # argparse keeps the last one only
        flag = _last_secret_flag(arg.partition("=")[2] if "=" in arg else next_word or "")
        if flag is not None and _first_loose_word(parser, target, rest) is not None:
            shown = printable(flag)  # quoted: the redaction of the message keeps its next word
            target.error(
                f"argument --vllm-args: its last flag, '{shown}', takes a value, and the word "
                "after it (or after the verirl flags that follow it) would be taken for another "
                "argument: give the flag and its value in "
                f"the one --vllm-args value, as in --vllm-args='{shown} VALUE' (a flag that "
                "takes none: put '--' just before the command)"
            )


def _first_loose_word(
    parser: argparse.ArgumentParser, target: argparse.ArgumentParser, words: Sequence[str]
) -> str | None:
    """The first of ``words`` that is neither verirl's flag nor such a flag's value.

    ``None`` when ``--`` or the end comes first. Such a word after a lone
    secret's flag is where its value went (``--vllm-args=--hf-token -v KEY``:
    KEY would be the command), whatever verirl flags stand between.
    """
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return None
        if not _is_a_flag_of(parser, target, word):
            return word
        name, equals, _ = word.partition("=")
        found = _option(target, name) or _option(parser, name)
        if found is not None and found.nargs != 0 and not equals:
            index += 1  # its value, whatever it looks like
    return None


def _is_a_flag_of(
    parser: argparse.ArgumentParser, target: argparse.ArgumentParser, word: str
) -> bool:
    """Whether ``word`` is ``--`` or one of verirl's own flags (``-vv`` too), not a value.

    A key may start with ``-``: anything else is a word the user gave.
    """
    if word == "--":
        return True
    name = word.partition("=")[0]
    if name.startswith("--"):
        return (_option(target, name) or _option(parser, name)) is not None
    letters = name[1:]
    short = _short_letters(parser, target)
    return name.startswith("-") and bool(letters) and all(c in short for c in letters)


def _short_letters(parser: argparse.ArgumentParser, target: argparse.ArgumentParser) -> set[str]:
    """The letters of verirl's one-letter flags (``v`` of ``-v``), the subcommand's too."""
    return {
        name[1]
        for p in (target, parser)
        for name in p._option_string_actions  # noqa: SLF001 - argparse keeps them only here
        if name[:1] == "-" and name[1:2] not in {"", "-"} and not name[2:]
    }


def _last_secret_flag(value: str) -> str | None:
    """``value``'s last word if it is a secret's flag with no value of its own, else ``None``.

    Split as the server's arguments are; ``--api-key`` and ``--api-key=`` alike.
    (A value with no ``-`` holds no flag: not split, which takes long on a long one.)
    """
    if "-" not in value:
        return None
    try:
        words = shlex.split(value)
    except ValueError:  # an unbalanced quote: the words as written, their quotes let go
        words = [bare for word in value.split() if (bare := word.strip("'\"\\"))]
    flag, _, given = (words[-1] if words else "").partition("=")
    return flag if flag.startswith("-") and not given and _hides_its_value(flag) else None


def _hides_its_value(flag: str) -> bool:
    """Whether ``flag`` holds a secret: `redact_argv` hides the word after it."""
    probe = [flag, "verirl-probe-value"]
    return redact_argv(probe) != probe


def _refuse_dashes_as_a_value(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``--flag=--`` (before the command's ``--``) is a usage error naming the flag.

    argparse drops a ``--`` from an option's values, so the flag got an empty
    list where a string or a number belongs: a traceback, or a value of ``[]``
    shown to the user, or a flag silently ignored.
    """
    target = _subcommand_parser(parser, command_word(argv))
    for arg, found, _, _ in _own_flags(parser, argv):
        flag, equals, value = arg.partition("=")
        takes_one = found is not None and found.nargs != 0
        if flag.startswith("--") and equals and value == "--" and takes_one:  # not the command's
            target.error(f"argument {flag}: expected one argument, not '--'")


def _own_flags(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> Iterator[tuple[str, argparse.Action | None, str | None, Sequence[str]]]:
    """Each flag-like word of ``argv`` before the training command, with what surrounds it.

    The word, verirl's action for it (``None``: not verirl's), its value given
    as the next word (``None``: with ``=``, none, or not verirl's), and the
    words after all that. The walk stops at ``--`` and
    where the training command begins (its first word after the subcommand's);
    a value is stepped over, whatever it looks like.
    """
    command = command_word(argv)
    target = _subcommand_parser(parser, command)
    takes_a_command = any(a.nargs == argparse.REMAINDER for a in target._actions)  # noqa: SLF001
    seen_command_word = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--":
            return
        if not arg.startswith("-"):
            if seen_command_word and takes_a_command:
                return  # the training command begins: what follows is its own
            seen_command_word = seen_command_word or arg == command
            continue
        name, equals, _ = arg.partition("=")
        found = _option(target, name) or _option(parser, name)
        value = None
        if found is not None and found.nargs != 0 and not equals:
            value = argv[index] if index < len(argv) else None
            index += 1  # its value, whatever it looks like
        yield arg, found, value, argv[index:]


def _subcommand_parser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser:
    """The parser of ``command`` (``parser`` itself for ``None`` or an unknown one)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction) and command is not None:  # noqa: SLF001
            found = action.choices.get(command)
            if isinstance(found, argparse.ArgumentParser):
                return found
    return parser


def _warn_repeated(args: argparse.Namespace) -> None:
    """A WARNING for each flag given more than once (never its values: one may be a secret)."""
    for flag in getattr(args, _REPEATED, ()):
        hint = " (put every vLLM flag in one --vllm-args='...')" if flag == "--vllm-args" else ""
        log.warning("%s was given more than once: only the last one counts%s", flag, hint)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``; help, version and usage errors printed, then `SystemExit`.

    With ``--json``, what they print becomes the run's one JSON document:
    ``{"help": TEXT}``, ``{"version": V}`` or the error document (exit 2).
    """
    captured: list[tuple[str, str]] = []
    token = _PARSE_OUTPUT.set(captured)
    try:
        _refuse_a_lone_secret_flag(parser, argv)
        try:
            _refuse_dashes_as_a_value(parser, argv)
            args = parser.parse_args(argv)
        except SystemExit as first:
            joined = _join_dash_values(argv)
            if first.code != EXIT_CONFIG or joined == argv:
                raise
            captured.clear()
            args = parser.parse_args(joined)
        _refuse_a_split_vllm_args(parser, args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        launch = command_word(argv) == "launch"
        json_wanted = wants_json(argv, takes_value=functools.partial(_takes_value, parser))
        _print_parse_output(
            captured,
            code,
            json_wanted=json_wanted,
            launch=launch,
            hidden=[*_after_secret_flags(parser, argv), *_taken_by_redaction(argv)],
        )
        raise SystemExit(code) from None
    finally:
        _PARSE_OUTPUT.reset(token)
    return args


def _takes_value(parser: argparse.ArgumentParser, command: str | None, option: str) -> bool:
    """Whether ``option`` of ``command`` (``None``: verirl's own, before it) takes a value."""
    found = _option(_subcommand_parser(parser, command), option)
    return found is not None and found.nargs != 0


def _option(target: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """``target``'s action for ``option``, spelled whole or as an abbreviation argparse takes."""
    options = target._option_string_actions  # noqa: SLF001 - argparse keeps them only here
    found = options.get(option)
    if found is None and option.startswith("--"):
        matches = {id(a): a for name, a in options.items() if name.startswith(option)}
        found = next(iter(matches.values())) if len(matches) == 1 else None
    return found


def _taken_by_redaction(argv: Sequence[str]) -> list[str]:
    """What `redact_argv` hides of ``argv``'s words (``curl -u u:KEY``), for a usage error.

    argparse quotes the words it refused as they are; the message's own rules
    see no tool there (``verirl plan curl -u u:KEY``: "unrecognized arguments").
    """
    taken: list[str] = []
    for word, shown in zip(argv, redact_argv(argv), strict=True):
        if word != shown:  # each part hidden on its own: what lies between them stays readable
            taken += _hidden_parts(word, shown) or [taken_out(word, shown)]
    return taken


def _hidden_parts(word: str, shown: str) -> list[str]:
    """The parts of ``word`` that `HIDDEN` replaced in ``shown``; [] when they cannot be told.

    What lies between the markers is found again in ``word``, in order (a line
    that redaction quoted anew may not be: then [] and the caller hides more).
    """
    segments = shown.split(HIDDEN)
    if not word.startswith(segments[0]) or not word.endswith(segments[-1]):
        return []
    parts: list[str] = []
    at, end = len(segments[0]), len(word) - len(segments[-1])
    for segment in segments[1:-1]:
        found = word.find(segment, at, end) if segment else at
        if found < 0:
            return []
        parts.append(word[at:found])
        at = found + len(segment)
    parts.append(word[at:end])
    return [part for part in parts if part]


def _after_secret_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` that may be a secret's value left on its own, to hide.

    After a word (or a ``--flag=`` value) whose last word is a secret's flag
    without its value (`_last_secret_flag`): every word but ``--`` and the
    names of verirl's own flags (``-vv`` too: `_is_a_flag_of`), which stay
    readable. Their values are hidden (``--tensor-parallel-size KEY``: vLLM
    has that flag too), given as the next word or after ``=`` (``-v=KEY``).
    A usage error may quote any of them (argparse's "unrecognized arguments:
    KEY", "invalid choice: 'KEY'"), however the mistake was spelled. A word
    that starts with one ``-`` is hidden with the tails argparse may quote of
    it (`_quotable_tails`: ``-vKEY``, "ignored explicit argument 'KEY'").
    """
    hidden: list[str] = []
    target = _subcommand_parser(parser, command_word(argv))
    letters = _short_letters(parser, target)
    for index, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if _last_secret_flag(value) is None and _last_secret_flag(arg) is None:
            continue
        for word in argv[index + 1 :]:
            if _is_a_flag_of(parser, target, word):  # "--" too, whose value is ""
                name, _, value = word.partition("=")
                if name.startswith("--"):
                    hidden.append(value)
                else:  # '-v=hf_KEY': argparse may take '-h' with 'f_KEY'
                    hidden.extend(_quotable_tails(value, letters))
                continue
            hidden.append(word)
            if word.startswith("-") and not word.startswith("--"):
                hidden.extend(_quotable_tails(word[1:], letters))
        break  # every later word is walked: a later secret's flag adds nothing
    return hidden


def _quotable_tails(text: str, letters: set[str]) -> list[str]:
    """The tails of ``text`` argparse may quote after a short flag, ``text`` itself first.

    It takes each leading letter that is a short flag of verirl's (``-vq…``)
    and quotes what follows where that run ends ("ignored explicit argument
    'KEY'"): the tails about there and after the first few letters; never
    every tail, which would hide the endings of ordinary words and cost time
    in the value's length squared.
    """
    run = 0
    while run < len(text) and text[run] in letters:
        run += 1
    starts = {*range(min(run, 8)), run - 1, run, run + 1}
    return [text[start:] for start in sorted(starts) if 0 <= start < len(text)]


_SEE_HELP = re.compile(r" \(see verirl(?: [a-z-]+)? --help\)\n\Z")
"""The hint `_Parser.error` ends a usage error with."""


def _print_parse_output(
    captured: list[tuple[str, str]],
    code: int,
    *,
    json_wanted: bool,
    launch: bool = False,
    hidden: Sequence[str] = (),
) -> None:
    _read_run_secrets()
    _RUN_SECRETS.extend(word for word in hidden if word.strip() and word != "--")
    errors = "".join(text for text, channel in captured if channel == "stderr")
    hint = _SEE_HELP.search(errors)  # ours: no value of a flag the message ends with
    errors = _hidden(errors[: hint.start()]) + hint[0] if hint else _hidden(errors)
    if errors:
        STDERR.write(errors)
    out = _for_stdout("".join(text for text, channel in captured if channel != "stderr"))
    if not json_wanted:
        if out:
            STDOUT.write(out)
        return
    document: dict[str, object]
    if code != EXIT_OK:
        document = _error_document(code, errors.strip() or "usage error")
        if launch:  # launch's documents always carry its exit code
            document["exit_code"] = code
    elif any(channel == "version" for _, channel in captured):
        document = {"version": __version__}
    else:
        document = {"help": out}
    write_document(document)
