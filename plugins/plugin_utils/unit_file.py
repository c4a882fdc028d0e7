# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A service's command line and environment as systemd reads them from its unit file, for the recorded baseline.

The rollback starts the recorded copy of the user's unit, so that copy's ``ExecStart=`` is what must be validated, not
the running server's ``/proc`` command line. systemd tells its parse of a unit only for a loaded unit, and
``systemctl show`` joins the argv with bare spaces, so the file is read here with systemd's own rules
(systemd.syntax(7): sections, ``#``/``;`` comments, a trailing backslash continuing the line as a space;
systemd.service(5) "Command lines": the ``@-:+!`` prefixes, words split at whitespace, single and double quotes
anywhere in a word, C escapes, ``%%``, ``$$``; systemd.exec(5): ``Environment=`` words, an empty assignment resetting).
What a unit could use beyond that (other ``%`` specifiers, ``$VAR`` expanded at start, several commands) is not
guessed: it is reported as the reason the command line cannot be read exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

WHITESPACE = " \t\n\r"
COMMENTS = "#;"
PREFIXES = "@-:+!"
SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " ",
                  "\\": "\\", '"': '"', "'": "'"}
SGLANG_VARIABLE = re.compile(r"^(SGLANG|DDTREE)_[A-Z0-9_]*$")
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)")
# systemctl show's rendering of one command: { path=... ; argv[]=... ; ignore_errors=... (or flags=... for *Ex) ; ... }
SHOWN_COMMAND = re.compile(r"^\{ path=(?P<path>.*?) ; argv\[\]=(?P<argv>.*) ; (?:ignore_errors|flags)=[^;]* ; ")


class UnitSyntaxError(ValueError):
    """The unit uses syntax this reader does not model; the message says which."""


@dataclass
class UnitCommand:
    """``ExecStart=`` of a unit's ``[Service]`` as systemd would run it, and its ``Environment=``.

    ``argv`` is what the process gets (``argv[0]`` included); ``executable`` is the file systemd executes (``argv[0]``
    unless the ``@`` prefix names another). ``problem`` is empty when ``argv`` is exact, else why it is not.
    """

    argv: list[str] = field(default_factory=list)
    executable: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    environment_files: list[str] = field(default_factory=list)
    problem: str = ""

    @property
    def sglang_environment(self) -> dict[str, str]:
        """The variables SGLang and the plugin read (``SGLANG_*``, ``DDTREE_*``: the plugin selection among them),
        without any whose name looks secret: what is recorded and what the validation runs with."""
        return {name: value for name, value in self.environment.items()
                if SGLANG_VARIABLE.match(name) and not SECRET_NAME.search(name)}

    def as_dict(self) -> dict[str, Any]:
        return {"argv": self.argv, "executable": self.executable, "environment": self.environment,
                "sglang_environment": self.sglang_environment, "environment_files": self.environment_files,
                "problem": self.problem}


def logical_lines(text: str) -> list[str]:
    """The unit's lines after systemd's continuation rule: an unescaped trailing backslash becomes a space and the next
    line is appended; comment lines inside a continued line are dropped."""
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        if pending is not None and raw.lstrip(WHITESPACE)[:1] in tuple(COMMENTS):
            continue
        line = raw if pending is None else pending + raw
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = line[:-1] + " "
            continue
        pending = None
        lines.append(line)
    if pending is not None:
        lines.append(pending)
    return lines


def section_assignments(text: str, section: str) -> list[tuple[str, str]]:
    """``(key, value)`` of one section, in file order (keys may repeat)."""
    current = None
    found: list[tuple[str, str]] = []
    for line in logical_lines(text):
        stripped = line.strip(WHITESPACE)
        if not stripped or stripped[0] in COMMENTS:
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = stripped[1:-1]
            continue
        key, sep, value = stripped.partition("=")
        if sep and current == section:
            found.append((key.strip(WHITESPACE), value.strip(WHITESPACE)))
    return found


def expand_specifiers(value: str) -> str:
    """``%%`` is a percent sign; any other specifier depends on the unit's name, host or user and is not guessed."""
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char != "%":
            out.append(char)
            index += 1
            continue
        following = value[index + 1: index + 2]
        if following != "%":
            raise UnitSyntaxError(f"it uses the specifier %{following} (systemd.unit(5) \"Specifiers\"), which Pivot "
                                  "does not expand")
        out.append("%")
        index += 2
    return "".join(out)


def _escape(value: str, index: int) -> tuple[str, int]:
    """The character a C escape at value[index] (just after the backslash) stands for, and the index after it."""
    char = value[index: index + 1]
    if not char:
        raise UnitSyntaxError("a word ends in a lone backslash")
    if char in SIMPLE_ESCAPES:
        return SIMPLE_ESCAPES[char], index + 1
    for lead, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if char == lead:
            code = value[index + 1: index + 1 + digits]
            if len(code) == digits and all(c in "0123456789abcdefABCDEF" for c in code):
                return chr(int(code, base)), index + 1 + digits
    code = value[index: index + 3]
    if len(code) == 3 and all(c in "01234567" for c in code):
        return chr(int(code, 8)), index + 3
    raise UnitSyntaxError(f"it uses the escape \\{char}, which Pivot does not read")


def split_words(value: str) -> list[str]:
    """Words as systemd's extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) splits them."""
    words: list[str] = []
    index, length = 0, len(value)
    while True:
        while index < length and value[index] in WHITESPACE:
            index += 1
        if index >= length:
            return words
        word: list[str] = []
        quote = ""
        while index < length:
            char = value[index]
            if char == "\\":
                unescaped, index = _escape(value, index + 1)
                word.append(unescaped)
            elif quote:
                index += 1
                if char == quote:
                    quote = ""
                else:
                    word.append(char)
            elif char in "'\"":
                quote = char
                index += 1
            elif char in WHITESPACE:
                break
            else:
                word.append(char)
                index += 1
        if quote:
            raise UnitSyntaxError(f"a {quote} quote is not closed")
        words.append("".join(word))


def _environment_free(word: str) -> str:
    """A word after systemd's start-time substitution when it uses none: ``$$`` is a dollar sign."""
    if "$" in word.replace("$$", ""):
        raise UnitSyntaxError(f"the word {word!r} uses an environment variable ($NAME or ${{NAME}}), which systemd "
                              "substitutes when it starts the service and Pivot does not")
    return word.replace("$$", "$")


def exec_command(value: str) -> tuple[list[str], str]:
    """argv and the executable of one ``ExecStart=`` value."""
    words = split_words(expand_specifiers(value))
    if not words:
        raise UnitSyntaxError("ExecStart= is empty")
    first = words[0]
    prefixes = first[: len(first) - len(first.lstrip(PREFIXES))]
    words[0] = first[len(prefixes):]
    if ";" in words:
        raise UnitSyntaxError("ExecStart= holds several commands separated by ';'")
    if ":" not in prefixes:
        words = [_environment_free(word) for word in words]
    if "@" in prefixes:
        if len(words) < 2:
            raise UnitSyntaxError("the @ prefix needs the executable and argv[0]")
        executable, argv = words[0], words[1:]
    else:
        executable, argv = words[0], words
    if not executable.startswith("/"):
        raise UnitSyntaxError(f"ExecStart= runs {executable!r} by name, which systemd looks up in its own search path "
                              "(not the venv's): write the interpreter's full path")
    return argv, executable


def read_command(text: str) -> UnitCommand:
    """The service's command line and environment; ``problem`` says why they cannot be read exactly."""
    command = UnitCommand()
    starts: list[str] = []
    try:
        for key, value in section_assignments(text, "Service"):
            if key == "ExecStart":
                starts = [] if not value else [*starts, value]
            elif key == "Environment":
                if not value:
                    command.environment = {}
                for word in split_words(expand_specifiers(value)):
                    name, sep, setting = word.partition("=")
                    if sep and name:
                        command.environment[name] = setting
            elif key == "EnvironmentFile":
                command.environment_files = [] if not value else [*command.environment_files, value]
        if not starts:
            raise UnitSyntaxError("it has no ExecStart= in [Service]")
        if len(starts) > 1:
            raise UnitSyntaxError(f"it has {len(starts)} ExecStart= lines (a service of Type=simple runs one)")
        command.argv, command.executable = exec_command(starts[0])
    except UnitSyntaxError as error:
        command.problem = f"Pivot cannot read its command line exactly: {error}"
    return command


def loaded_command_problem(command: UnitCommand, shown: str) -> str:
    """Why the ExecStart systemd has loaded (``systemctl show``'s ExecStart value) differs from the file's, or ''.

    systemctl joins the argv with bare spaces, so the comparison is of the joined text: what differs there differs for
    systemd. A drop-in, or an edit systemd has not reloaded yet, is the usual cause."""
    match = SHOWN_COMMAND.match(shown.strip())
    if match is None:
        return f"systemd shows its ExecStart as {shown.strip()!r}, which is not one command"
    loaded_argv, loaded_path = match.group("argv"), match.group("path")
    if loaded_argv == " ".join(command.argv) and loaded_path == command.executable:
        return ""
    return (f"systemd runs {loaded_argv!r} ({loaded_path}) for this unit, but the unit file says "
            f"{' '.join(command.argv)!r} ({command.executable}): a drop-in or an edit not yet loaded (systemctl "
            "daemon-reload) changes it. Pivot records the file as the rollback target, so the two must agree")


def unit_command(text: str, shown_exec_start: str | None = None) -> dict[str, Any]:
    """:func:`read_command` as a dict, its ``problem`` also set when ``shown_exec_start`` (what systemd has loaded)
    disagrees with the file."""
    command = read_command(text)
    if not command.problem and shown_exec_start:
        command.problem = loaded_command_problem(command, shown_exec_start)
    return command.as_dict()


def environment_file_variables(text: str) -> dict[str, str]:
    """``NAME=value`` lines of an environment file as Pivot renders them (environment.j2: no quoting), comments and
    blank lines skipped."""
    variables: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip(WHITESPACE)
        if not stripped or stripped[0] in COMMENTS:
            continue
        name, sep, value = stripped.partition("=")
        if sep and name:
            variables[name.strip(WHITESPACE)] = value
    return variables


def _word_difference(expected: list[str], found: list[str]) -> str:
    """The words that differ between two command lines, as ``'x' where it should be 'y'`` phrases."""
    phrases = []
    for tag, e_from, e_to, f_from, f_to in SequenceMatcher(a=expected, b=found, autojunk=False).get_opcodes():
        want, got = " ".join(expected[e_from:e_to]), " ".join(found[f_from:f_to])
        if tag == "replace":
            phrases.append(f"{got!r} where it should be {want!r}")
        elif tag == "insert":
            phrases.append(f"{got!r} added")
        elif tag == "delete":
            phrases.append(f"{want!r} missing")
    return "; ".join(phrases)


def _environment_difference(expected: dict[str, str], found: dict[str, str]) -> str:
    phrases = []
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            phrases.append(f"{name} missing")
        elif name not in expected:
            phrases.append(f"{name}={found[name]} added")
        elif found[name] != expected[name]:
            phrases.append(f"{name}={found[name]} where it should be {expected[name]}")
    return "; ".join(phrases)


def unit_drift(record: dict[str, Any], status: dict[str, Any], unit_text: str | None = None,
               environment_text: str | None = None) -> list[str]:
    """How a release's unit differs from what Pivot rendered or recorded for it (its ``release.json``), one sentence
    per difference; empty when they agree.

    ``status`` is ``systemctl show`` of the unit (what systemd has loaded): drop-ins, a file systemd has not reloaded
    (``NeedDaemonReload``) and the loaded ``ExecStart`` are judged from it. With ``unit_text`` (the release's unit file)
    the file's ``ExecStart=`` and ``Environment=`` are judged too, and with ``environment_text`` (a rendered release's
    environment file) its variables: the release's SGLang and DDTree settings must be exactly the recorded ones."""
    source = "recorded" if record.get("source") == "recorded" else "rendered"
    expected_argv = [str(word) for word in record.get("argv") or []]
    expected_environment = {str(k): str(v) for k, v in (record.get("environment") or {}).items()}
    problems: list[str] = []
    drop_ins = str(status.get("DropInPaths") or "").split()
    if drop_ins:
        problems.append(f"drop-ins change the unit ({', '.join(drop_ins)}): they apply to every release Pivot links "
                        "there, so what would run is not the release's own unit")
    if str(status.get("NeedDaemonReload") or "no") == "yes":
        problems.append("systemd has not loaded the unit's file as it is now (NeedDaemonReload=yes)")
    shown = str(status.get("ExecStart") or "")
    match = SHOWN_COMMAND.match(shown.strip())
    if shown and (match is None or match.group("argv") != " ".join(expected_argv)):
        loaded = match.group("argv").split(" ") if match else [shown.strip()]
        problems.append(f"systemd has loaded another command line than Pivot {source}: "
                        f"{_word_difference(expected_argv, loaded)}")
    if unit_text is not None:
        command = read_command(unit_text)
        if command.problem:
            problems.append(f"its unit file cannot be compared: {command.problem}")
        elif command.argv != expected_argv:
            problems.append(f"its unit file's ExecStart= is not the command line Pivot {source}: "
                            f"{_word_difference(expected_argv, command.argv)}")
        found_environment = dict(command.sglang_environment)
        if environment_text is not None:
            found_environment.update(environment_file_variables(environment_text))
        if not command.problem and found_environment != expected_environment:
            problems.append(f"its SGLang and DDTree environment is not the one Pivot {source}: "
                            f"{_environment_difference(expected_environment, found_environment)}")
    return problems
