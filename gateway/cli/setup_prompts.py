"""The questions of `gateway setup`: asked on the terminal, read line by line from a pipe (a
script or a test answers them through stdin), or, with `--non-interactive`, never asked: the
flags and the current settings answer them.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from typing import TextIO


class SetupAborted(Exception):
    """The run stops without writing anything; the message says why."""


class Prompter:
    def __init__(self, interactive: bool, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.interactive = interactive
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.tty = self.stdin.isatty()

    def say(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def ask(self, question: str, default: str = "", *, check: Callable[[str], str] | None = None) -> str:
        """An answer (the default for an empty line); `check` returns what is wrong with one, or ""."""
        if not self.interactive:
            return default
        shown = f"{question} [{default}]: " if default else f"{question}: "
        while True:
            answer = self._line(shown) or default
            problem = check(answer) if check and answer else ""
            if not problem:
                return answer
            self.say(f"  {problem}")

    def secret(self, question: str, has_current: bool) -> str:
        """A secret, not echoed on a terminal; empty keeps the current one (returns "")."""
        if not self.interactive:
            return ""
        shown = f"{question} [Enter keeps the current one]: " if has_current else f"{question}: "
        return self._line(shown, hidden=True)

    def yes(self, question: str, default: bool) -> bool:
        if not self.interactive:
            return default
        shown = f"{question} [{'Y/n' if default else 'y/N'}]: "
        while True:
            answer = self._line(shown).lower()
            if not answer:
                return default
            if answer in ("y", "yes", "n", "no"):
                return answer.startswith("y")
            self.say("  answer y or n")

    def choose(self, question: str, options: list[str], default: str) -> str:
        """One of `options`, by its number or its name (another name is taken as it is)."""
        for number, option in enumerate(options, 1):
            self.say(f"  {number}. {option}")

        def known(answer: str) -> str:
            if answer.isdigit() and not 1 <= int(answer) <= len(options):
                return f"pick a number from 1 to {len(options)}, or type a name"
            return ""

        answer = self.ask(question, default, check=known)
        return options[int(answer) - 1] if answer.isdigit() else answer

    def _line(self, prompt: str, *, hidden: bool = False) -> str:
        if self.tty:
            try:
                return (getpass.getpass(prompt) if hidden else input(prompt)).strip()
            except EOFError:
                raise SetupAborted(f"no answer to {prompt.strip()!r}: nothing was written") from None
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise SetupAborted(f"the input ended before {prompt.strip()!r} was answered: nothing was written")
        self.say()
        return line.strip()
