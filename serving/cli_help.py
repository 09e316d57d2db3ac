"""Command-line helpers shared by `captioner serve` and `captioner caption`.

TF's boolean flag syntax (`parse_bool`) and a `--help` that shows every
flag's default (`DefaultsHelpFormatter`).
"""
from __future__ import annotations

import argparse
import copy


def parse_bool(text: str) -> bool:
    """TF's flag syntax for booleans: true/false/1/0."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """`--help` shows every flag's default (unless its help already names it)."""

    @staticmethod
    def _shows_default(action) -> bool:
        return bool(action.option_strings) and action.default not in (None, argparse.SUPPRESS) \
            and not (action.nargs == 0 and action.default is False)  # on/off switches

    def _format_action(self, action):
        if not action.help and self._shows_default(action):  # argparse skips empty help
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or not self._shows_default(action):
            return text
        return f"{text} (default: %(default)s)"
