"""``--help`` in sections, the options a new user needs first and compatibility flags last.

A command with many options names, for each one, the section ``--help`` lists it in
(:data:`SECTIONS`): sections and the options in each come in the table's order, whatever the
order the options are declared in. Each option is named by its first long flag (``--module``
for ``-m, --module``). tests/test_help.py fails for an option of such a command that no section
names, saying to add it here.
"""

from __future__ import annotations

import click

# command (as typed after ``ttmesh``) -> (section title, its options by first long flag), in order.
SECTIONS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "launch": (
        ("The job", (
            "--tp-size", "--sim", "--root", "--env", "--dry-run", "--json", "--show-env",
            "--job-id", "--module", "--no-python", "--workdir", "--summary-json", "--version",
            "--help",
        )),
        ("Chips and mesh", (
            "--chips", "--exclude", "--mesh-shape", "--mesh-layout", "--nproc-per-node",
            "--launcher", "--symmetric-dram-mb", "--strict-links",
        )),
        ("Serving and fleets (docs/serving.md)", (
            "--profile", "--strict", "--health-interval", "--health-failures", "--probe-interval",
            "--probe-timeout", "--replicas",
            "--replicas-parallel", "--router-arg", "--no-memory-check",
        )),
        ("Several hosts (docs/multihost.md)", (
            "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-backend", "--rdzv-token",
            "--local-addr", "--heartbeat-timeout", "--rdzv-timeout", "--hosts", "--launch-agent",
            "--tcp-interface",
        )),
        ("Recovery, hangs and stopping (docs/recovery.md, docs/torchrun.md)", (
            "--max-restarts", "--auto-reset", "--reset-on-failure", "--tt-smi",
            "--train-timeout", "--grace", "--fabric-grace", "--on-reset-notice",
            "--ready-timeout", "--ready-pattern", "--hang-timeout", "--op-timeout",
        )),
        ("Output", (
            "--ranks-filter", "--log-dir", "--redirects", "--tee", "--quiet", "--no-live",
            "--no-logs",
        )),
        ("torchrun's and tt-run's flags (docs/torchrun.md, docs/tt-run.md)", (
            "--master-port", "--standalone", "--master-addr", "--rdzv-conf", "--role",
            "--virtual-local-rank", "--numa-binding", "--signals-to-handle", "--rank-binding",
            "--rank-bindings-mapping",
        )),
    ),
    "check": (
        ("The chips", ("--sim", "--root", "--chips", "--strict", "--profile")),
        ("Running ttnn on them", ("--active", "--ttnn-python", "--mesh-layout")),
        ("Output", ("--json", "--notes", "--help")),
        ("Several hosts (docs/multihost.md)", ("--hosts", "--launch-agent")),
    ),
    "reset": (
        ("The chips", ("--sim", "--root", "--chips", "--no-expand", "--force")),
        ("tt-smi and its verdict", ("--tt-smi", "--timeout", "--train-timeout", "--retries")),
        ("Output", ("--json", "--no-live", "--help")),
        ("Several hosts (docs/multihost.md)", ("--hosts", "--launch-agent")),
    ),
    "descriptor": (
        ("The mesh", (
            "--sim", "--root", "--tp-size", "--mesh-shape", "--mesh-layout", "--nproc-per-node",
            "--chips", "--exclude", "--strict-links",
        )),
        ("Output", ("--per-rank", "--output", "--export-rank-binding", "--help")),
        ("Several hosts (docs/multihost.md)", ("--hosts", "--launch-agent", "--tcp-interface")),
    ),
    "sim create": (
        ("The host", ("--system", "--from-capture", "--root", "--host", "--force")),
        ("Its timing (ttmesh sim config)", (
            "--heartbeat-hz", "--cables", "--cable-window", "--cable-train-seconds",
        )),
        ("Help", ("--help",)),
    ),
}  # fmt: skip


COLUMN = 30  # the widest option column (click's own): a longer one puts its help below it


def flag_of(param: click.Option) -> str:
    """An option's name in :data:`SECTIONS`: its first long flag."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def command_key(ctx: click.Context) -> str:
    """The command as typed after ``ttmesh`` (``sim create``), its own name when run alone."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or ctx.command.name or "")
        ctx = ctx.parent
    return " ".join(reversed(names)) or ctx.command.name or ""


def _without_underscores(param: click.Option, shown: str) -> str:
    """The option's names less torchrun's second spellings (``--nproc_per_node`` beside
    ``--nproc-per-node``): taken, and said once in the command's help, not on every line."""
    for name in param.opts:
        if "_" in name and name.replace("_", "-") in param.opts:
            shown = shown.replace(f", {name}", "")
    return shown


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options in :data:`SECTIONS`' sections."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections = SECTIONS.get(command_key(ctx))
        if sections is None:
            super().format_options(ctx, formatter)
            return
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                records[flag_of(param)] = (_without_underscores(param, record[0]), record[1])
        # One column for the help text in every section (each section alone would align its own).
        width = min(max((len(first) for first, _ in records.values()), default=0), COLUMN)
        records = {flag: (first.ljust(width), text) for flag, (first, text) in records.items()}
        for title, flags in sections:
            rows = [records.pop(f) for f in flags if f in records]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows, col_max=COLUMN)
        if records:  # in no section (tests/test_help.py says where to add them): still listed
            with formatter.section("Other options"):
                formatter.write_dl(list(records.values()), col_max=COLUMN)
