"""Shell completion scripts for `pollux-cli`, generated from its argparse parser.

Why generated and not written by hand: the parser is the one description of the commands,
their flags and the values a flag takes, so a script made from it cannot fall behind (and
needs no argcomplete at run time: completing is pure shell, without starting Python).

Both scripts share one shell function, ``_pollux_cli_candidates WORD... CURRENT``, written in
the subset of shell that bash and zsh agree on. It walks the words before the cursor to find
the (sub)command they name, skipping each flag's value, and prints what may come next: one
candidate a line, ``NAME`` or ``NAME:HELP``, ``@files`` / ``@dirs`` for a path, or
``@jobs`` for a job (names and ids the scheduler gives the hidden ``pollux-cli __jobs``).
The per-shell wrappers only turn those lines into bash's ``COMPREPLY`` or zsh's ``_describe``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh")
FILES = "@files"
"""A value hint: complete file names."""
DIRS = "@dirs"
"""A value hint: complete directory names."""
JOBS = "@jobs"
"""A positional hint: complete job names and ids (asked of the scheduler: `JOBS_COMMAND`)."""
JOBS_COMMAND = "__jobs"
"""The hidden command that prints the caller's jobs for completion, one name or id a line."""

_FUNCTION = "_pollux_cli"


@dataclass
class _Level:
    """One (sub)command: what may follow it."""

    path: str
    """The subcommand words from the top, space-separated ("" is the program itself)."""
    commands: list[tuple[str, str]] = field(default_factory=list)
    """Subcommands and positional choices, with help."""
    options: list[tuple[str, str]] = field(default_factory=list)
    """Visible flags with help (hidden ones are accepted but not offered)."""
    takes_value: list[str] = field(default_factory=list)
    """Every flag, hidden ones too, whose next word is its value."""
    values: dict[str, list[str]] = field(default_factory=dict)
    """Candidates of a flag's value: its choices, or a hint (`FILES`, `DIRS`, a list)."""
    positional: str = ""
    """A hint for the command's positional argument (`JOBS`), if it has one."""


def _short(text: str | None) -> str:
    words = " ".join((text or "").split())
    return words if len(words) <= 70 else words[:67].rsplit(" ", 1)[0] + "..."


def _levels(
    parser: argparse.ArgumentParser, hints: Mapping[str, Sequence[str]], path: str = ""
) -> Iterator[_Level]:
    """Every (sub)command of `parser`, depth first."""
    level = _Level(path)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if name.startswith("__"):
                    continue  # hidden commands (JOBS_COMMAND) are not offered
                level.commands.append((name, _short(helps.get(name))))
                children.append((name, child))
            continue
        if not action.option_strings:
            level.commands.extend((str(c), "") for c in action.choices or ())
            if not action.choices and hints.get(action.dest) == (JOBS,):
                level.positional = JOBS
            continue
        visible = action.help != argparse.SUPPRESS
        if visible:
            level.options.extend((flag, _short(action.help)) for flag in action.option_strings)
        if action.nargs == 0:
            continue
        level.takes_value.extend(action.option_strings)
        choices = [str(c) for c in action.choices] if action.choices else None
        values = choices if choices is not None else list(hints.get(action.dest, ()))
        if values:
            level.values.update((flag, values) for flag in action.option_strings)
    yield level
    for name, child in children:
        yield from _levels(child, hints, f"{path} {name}".strip())


def _quote(text: str) -> str:
    """A single-quoted shell word (the same in bash and zsh)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _lines(items: Sequence[tuple[str, str]]) -> str:
    return " ".join(_quote(f"{name}:{text}" if text else name) for name, text in items)


def _tables(levels: Sequence[_Level]) -> str:
    """The shell functions that hold the parser's data, as case statements."""

    def keyed(pairs: Sequence[str]) -> str:
        return "|".join(_quote(p) for p in pairs)

    commands = [
        f"    {_quote(lv.path)}) printf '%s\\n' {_lines(lv.commands)} ;;"
        for lv in levels
        if lv.commands
    ]
    options = [
        f"    {_quote(lv.path)}) printf '%s\\n' {_lines(lv.options)} ;;"
        for lv in levels
        if lv.options
    ]
    is_command = [f"{lv.path}|{name}" for lv in levels for name, _ in lv.commands]
    takes_value = [f"{lv.path}|{flag}" for lv in levels for flag in lv.takes_value]
    values = [
        f"    {_quote(f'{lv.path}|{flag}')}) printf '%s\\n' {' '.join(map(_quote, vals))} ;;"
        for lv in levels
        for flag, vals in lv.values.items()
    ]
    positional = [
        f"    {_quote(lv.path)}) echo {lv.positional} ;;" for lv in levels if lv.positional
    ]
    return "\n".join(
        [
            f"{_FUNCTION}_commands() {{",
            '  case "$1" in',
            *commands,
            "    *) return 1 ;;",
            "  esac",
            "}",
            f"{_FUNCTION}_options() {{",
            '  case "$1" in',
            *options,
            "  esac",
            "}",
            f"{_FUNCTION}_is_command() {{",
            '  case "$1|$2" in',
            f"    {keyed(is_command) or _quote('')}) return 0 ;;",
            "  esac",
            "  return 1",
            "}",
            f"{_FUNCTION}_takes_value() {{",
            '  case "$1|$2" in',
            f"    {keyed(takes_value) or _quote('')}) return 0 ;;",
            "  esac",
            "  return 1",
            "}",
            f"{_FUNCTION}_values() {{",
            '  case "$1|$2" in',
            *values,
            "  esac",
            "}",
            f"{_FUNCTION}_positional() {{",
            '  case "$1" in',
            *positional,
            "    *) return 1 ;;",
            "  esac",
            "}",
        ]
    )


_CANDIDATES = """\
{name}_candidates() {{
  # $1..$N: the words after the program name, $N the one being completed. Prints the
  # candidates for $N: NAME or NAME:HELP a line, or @files / @dirs.
  {setup}local cmd="" opt="" rest=0 word=""
  while [ "$#" -gt 1 ]; do
    word=$1
    shift
    if [ -n "$opt" ]; then opt=""; continue; fi
    [ "$rest" = 1 ] && continue
    case $word in
      --) rest=1 ;;
      -*=*) ;;
      -*) {name}_takes_value "$cmd" "$word" && opt=$word ;;
      *) {name}_is_command "$cmd" "$word" && cmd="${{cmd:+$cmd }}$word" ;;
    esac
  done
  word=${{1-}}
  if [ -n "$opt" ]; then {name}_values "$cmd" "$opt"; return 0; fi
  if [ "$rest" = 1 ]; then echo @files; return 0; fi
  case $word in
    -*=*) {name}_values "$cmd" "${{word%%=*}}" ;;
    -*) {name}_options "$cmd" ;;
    *) {name}_commands "$cmd" || {name}_positional "$cmd" || {name}_options "$cmd" ;;
  esac
  return 0
}}"""

_BASH = """\
# bash completion for pollux-cli, generated from its parser by `pollux-cli completion bash`.
# Load it in ~/.bashrc:  source <(pollux-cli completion bash)
{tables}
{candidates}
{name}() {{
  local -a words=()
  local i word line cur
  COMPREPLY=()
  [ "${{COMP_CWORD:-0}}" -ge 1 ] || return 0
  # bash splits "--output=json" at "=" (COMP_WORDBREAKS); join it back into one word.
  for ((i = 1; i <= COMP_CWORD; i++)); do
    word=${{COMP_WORDS[i]}}
    if [ "${{#words[@]}}" -gt 0 ] && [[ $word == "=" || ${{COMP_WORDS[i-1]}} == "=" ]]; then
      words[${{#words[@]}}-1]+=$word
    else
      words+=("$word")
    fi
  done
  cur=${{words[${{#words[@]}}-1]}}
  [[ $cur == -*=* ]] && cur=${{cur#*=}}
  while IFS= read -r line; do
    case $line in
      @jobs)
        # The scheduler's answer (a second at most); nothing when it cannot be asked.
        while IFS= read -r word; do
          [[ $word == "$cur"* ]] && COMPREPLY+=("$word")
        done < <(pollux-cli --timeout 2 {jobs} 2>/dev/null)
        ;;
      @files | @dirs)
        compopt -o filenames 2>/dev/null
        while IFS= read -r word; do COMPREPLY+=("$word"); done < <(
          if [ "$line" = @dirs ]; then compgen -d -- "$cur"; else compgen -f -- "$cur"; fi
        )
        ;;
      *) [[ ${{line%%:*}} == "$cur"* ]] && COMPREPLY+=("${{line%%:*}}") ;;
    esac
  done < <({name}_candidates "${{words[@]}}")
  return 0
}}
complete -F {name} pollux-cli
"""

_ZSH = """\
#compdef pollux-cli
# zsh completion for pollux-cli, generated from its parser by `pollux-cli completion zsh`.
# Load it after compinit in ~/.zshrc:  source <(pollux-cli completion zsh)
# or save it as _pollux-cli in a directory of $fpath.
{tables}
{candidates}
{name}() {{
  # No `emulate -L zsh` here: _describe needs the options the completion system set.
  local -a lines
  lines=(${{(f)"$({name}_candidates "${{(@)words[2,CURRENT]}}")"}})
  case ${{lines[1]-}} in
    @files) _files; return ;;
    @dirs) _files -/; return ;;
    @jobs)
      local -a jobs
      jobs=(${{(f)"$(pollux-cli --timeout 2 {jobs} 2>/dev/null)"}})
      compadd -a jobs
      return ;;
  esac
  (( ${{#lines}} )) || return 1
  # The value of --flag=VALUE: complete after the "=".
  if [[ $PREFIX == -*=* ]]; then
    IPREFIX+=${{PREFIX%%=*}}=
    PREFIX=${{PREFIX#*=}}
  fi
  _describe -t pollux-cli pollux-cli lines
}}
if [[ ${{funcstack[1]-}} == _pollux-cli ]]; then
  {name} "$@"
elif (( ${{+functions[compdef]}} )); then
  compdef {name} pollux-cli
fi
"""


def script(parser: argparse.ArgumentParser, shell: str, hints: Mapping[str, Sequence[str]]) -> str:
    """The completion script of `parser` for `shell` ("bash" or "zsh").

    Args:
        parser: The CLI's parser; its subcommands, flags and choices are what is completed.
        shell: One of `SHELLS`.
        hints: Candidates of flag values by argparse ``dest``, for flags whose values are
            checked by a type function rather than ``choices`` (or `FILES` / `DIRS`).
    """
    levels = list(_levels(parser, hints))
    tables = _tables(levels)
    if shell == "bash":
        return _BASH.format(
            jobs=JOBS_COMMAND,
            name=_FUNCTION,
            tables=tables,
            candidates=_CANDIDATES.format(name=_FUNCTION, setup=""),
        )
    if shell == "zsh":
        return _ZSH.format(
            jobs=JOBS_COMMAND,
            name=_FUNCTION,
            tables=tables,
            candidates=_CANDIDATES.format(name=_FUNCTION, setup="emulate -L zsh\n  "),
        )
    raise ValueError(f"no completion for shell {shell!r}; use one of {', '.join(SHELLS)}")
