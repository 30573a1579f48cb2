"""The ``verirl`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from verirl import __version__

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``verirl``."""
    parser = argparse.ArgumentParser(
        prog="verirl",
        description="Start, resume and tear down GRPO jobs (TRL + vLLM + env server).",
    )
    parser.add_argument("--version", action="version", version=f"verirl {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0
