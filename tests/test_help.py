"""``--help`` for people: a command with many options lists them in sections, the options a new
user needs first, each said in one or two lines (the detail is in docs/). In-process, ~0.1 s."""

from __future__ import annotations

import click

from ttmesh import cli
from ttmesh.cli.helpsections import COLUMN, SECTIONS, SectionedCommand, flag_of

MANY = 8  # a command with more options than this lists them in sections
WIDTH = 100  # the widest --help click draws here (CONTEXT's max_content_width)
WHERE = "ttmesh/cli/helpsections.py SECTIONS"


def _commands() -> dict[str, tuple[click.Command, click.Context]]:
    """Every command as typed after ``ttmesh`` -> (it, a context as running it makes)."""
    root = click.Context(cli.main, info_name="ttmesh", terminal_width=WIDTH)
    found: dict[str, tuple[click.Command, click.Context]] = {}

    def walk(group: click.Group, parent: click.Context, path: str) -> None:
        for name in group.list_commands(parent):
            command = group.get_command(parent, name)
            assert command is not None
            ctx = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH)
            found[f"{path}{name}"] = (command, ctx)
            if isinstance(command, click.Group):
                walk(command, ctx, f"{path}{name} ")

    walk(cli.main, root, "")
    return found


def _options(command: click.Command, ctx: click.Context) -> list[click.Option]:
    params = command.get_params(ctx)
    return [p for p in params if isinstance(p, click.Option) and not p.hidden]


def test_every_option_of_a_command_with_many_is_in_one_section() -> None:
    for path, (command, ctx) in _commands().items():
        flags = [flag_of(p) for p in _options(command, ctx)]
        if len(flags) <= MANY and path not in SECTIONS:
            continue
        assert isinstance(command, SectionedCommand), (
            f"ttmesh {path} has {len(flags)} options: give it cls=SectionedCommand and sections "
            f"in {WHERE}"
        )
        assert path in SECTIONS, f"ttmesh {path}: add its sections to {WHERE}"
        named = [f for _, section in SECTIONS[path] for f in section]
        missing = [f for f in flags if f not in named]
        assert missing == [], f"ttmesh {path}: add {missing} to a section of {WHERE}[{path!r}]"
        gone = [f for f in named if f not in flags]
        assert gone == [], f"ttmesh {path} has no {gone}: remove them from {WHERE}[{path!r}]"
        twice = sorted({f for f in named if named.count(f) > 1})
        assert twice == [], f"{WHERE}[{path!r}] names {twice} in more than one section"


def test_each_option_is_said_in_one_or_two_lines() -> None:
    """At the widest help, the detail is in the docs its section or the command names."""
    long = []
    for path in SECTIONS:
        command, ctx = _commands()[path]
        for param in _options(command, ctx):
            record = param.get_help_record(ctx)
            assert record is not None
            formatter = click.HelpFormatter(width=WIDTH, max_width=WIDTH)
            formatter.write_dl([(record[0].ljust(COLUMN), record[1])], col_max=COLUMN)
            lines = formatter.getvalue().splitlines()
            said = len(lines) - (1 if len(record[0]) > COLUMN else 0)
            if said > 2:
                long.append(f"ttmesh {path} {flag_of(param)}: {said} lines")
    assert long == []


def test_launch_help_starts_with_the_job() -> None:
    command, ctx = _commands()["launch"]
    text = command.get_help(ctx)
    titles = [line[:-1] for line in text.splitlines() if line and not line[0].isspace()]
    assert titles[1:] == [title for title, _ in SECTIONS["launch"]], titles
    job = text.split("\nThe job:\n", 1)[1]
    assert job.lstrip().startswith("--tp-size N"), job[:200]
    options = text.split("\nThe job:\n", 1)[1]
    assert "--nproc_per_node" not in options and "--nproc-per-node N|auto" in options
    assert len(text.splitlines()) < 200, "launch --help at 100 columns"
