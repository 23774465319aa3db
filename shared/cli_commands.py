"""Which command modules a command line needs: the one naming argv's command, else all.

`cosyq` and `cosyq-worker` register each command group from its own module, and a module
imports what its handlers need (the producer's client, rq, numpy). Registering all of them
for every start cost each `cosyq status` 0.6 CPU s of modules it never ran (1.0 s in all, a
refused setting included), hundreds of times a test run. A command line that names a known
command registers that command's module alone; help, a missing or unknown command register
every module, so argparse's help and errors read as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def chosen_modules(
    argv: Sequence[str] | None,
    commands: Mapping[str, str],
    *,
    options_with_value: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """The module registering argv's command, or every module of `commands` (command name →
    module) when argv is None, asks for help before its command, or names none it knows.
    `options_with_value` are the top-level options that take the next word as their value."""
    every = tuple(dict.fromkeys(commands.values()))
    if argv is None:
        return every
    words = iter(argv)
    for word in words:
        if word in options_with_value:
            next(words, None)
        elif word == "--":
            break
        elif not word.startswith("-"):
            return (commands[word],) if word in commands else every
        elif word.split("=", 1)[0] not in options_with_value:
            return every  # -h, --help, or an option argparse refuses with every command shown
    return every
