"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
