"""The docs pages written from the code: the CLI reference and the finding-code catalogue.

``scripts/mkdocs_hooks.py`` adds them to the site at build time and ``tests/test_docs.py``
calls the same functions, so neither page can drift from ``theseus --help`` or from
``compat/findings.py`` (ruff's ``generate_cli_help`` and rule pages do the same)."""

from __future__ import annotations

import inspect

import click

#: where each generated page lands in the site (paths under docs/)
CLI_PAGE = "reference/cli.md"
#: click (8.2 on) marks "no default given" with a sentinel of its own, older ones with None
_UNSET = getattr(click.core, "UNSET", None)
FINDINGS_PAGE = "reference/findings.md"


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _param_name(param: click.Parameter, ctx: click.Context) -> str:
    if isinstance(param, click.Option):
        names = ", ".join(param.opts + param.secondary_opts)
        if not param.is_flag and not param.count:
            names += " " + param.make_metavar(ctx)
        return names
    return param.make_metavar(ctx)


def _option_help(param: click.Option) -> str:
    text = param.help or ""
    extra = []
    if param.envvar and isinstance(param.envvar, str) and "$" + param.envvar not in text:
        extra.append(f"env: ${param.envvar}")
    if param.required:
        extra.append("required")
    default = param.default
    # a flag's default is "off"; a help that names its default already says it better
    if not param.is_flag and not callable(default) and default is not _UNSET and \
            default not in (None, (), "") and "default" not in text.lower():
        extra.append(f"default: {default}")
    if param.multiple:
        extra.append("may be given several times")
    if extra:
        text = f"{text} [{'; '.join(extra)}]".strip()
    return text


def _command(cmd: click.Command, ctx: click.Context, level: int) -> list[str]:
    path = ctx.command_path
    out = [f"{'#' * level} `{path}`", ""]
    # The usage line and help as --help prints them (help text is plain text with its own
    # line breaks, so it goes in a code block rather than through Markdown).
    out += ["```text", cmd.get_usage(ctx), "```", ""]
    help_text = inspect.cleandoc(cmd.help or "").replace("\b\n", "")
    if help_text:
        out += ["```text", help_text, "```", ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    args = [p for p in params if isinstance(p, click.Argument)]
    opts = [p for p in params if isinstance(p, click.Option)]
    if args:
        out.append("Arguments: " + ", ".join(f"`{_param_name(a, ctx)}`" for a in args))
        out.append("")
    if opts:
        out += ["| option | what it does |", "|---|---|"]
        out += [f"| `{_cell(_param_name(o, ctx))}` | {_cell(_option_help(o))} |"
                for o in opts]
        out.append("")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = click.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
            out += _command(sub, sub_ctx, level + 1)
    return out


def commands(group: click.Group | None = None, prefix: str = "theseus") -> list[str]:
    """Every command path the CLI has, groups and their subcommands: ``theseus plan show``."""
    group = group or _main()
    ctx = click.Context(group, info_name=prefix, **group.context_settings)
    found = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        found.append(f"{prefix} {name}")
        if isinstance(sub, click.Group):
            found += commands(sub, f"{prefix} {name}")
    return found


def _main() -> click.Group:
    # imported here: building the docs should not pay for the CLI unless it asks for it
    from migrate.cli import main

    return main


def cli_reference(group: click.Group | None = None) -> str:
    """The CLI reference page: every command and subcommand, its usage, help and options."""
    group = group or _main()
    ctx = click.Context(group, info_name="theseus", **group.context_settings)
    lines = [
        "# CLI reference",
        "",
        "Generated from the click commands when the site is built (`migrate/docgen.py`): "
        "it says what `theseus COMMAND --help` says. Every command exits with one of the "
        "codes of [Exit codes](../exit-codes.md).",
        "",
    ]
    lines += _command(group, ctx, 2)
    return "\n".join(lines).rstrip() + "\n"


def _all_codes() -> dict[str, tuple[str, str, str, str]]:
    """Every registered finding code: the cross-step ones of ``compat.findings`` and those
    each step type, the checkpoint check and the fleet check register when imported."""
    import compat.checkpoint_check  # noqa: F401
    import compat.fleet.check  # noqa: F401
    import compat.fleet.contract  # noqa: F401
    import compat.steps  # noqa: F401
    from compat.findings import CODES

    return dict(CODES)


def finding_catalogue() -> str:
    """The finding-code catalogue: each code's default effect, severity, upgrade type and
    the hint the report prints."""
    from compat.findings import EFFECTS, UPGRADE_TYPES

    codes = _all_codes()
    lines = [
        "# Finding codes",
        "",
        "Generated from `compat/findings.py` and the codes each step type registers "
        "(`register_codes`) when the site is built (`migrate/docgen.py`). Codes are stable: "
        "scripts and CI may match on them.",
        "",
        "The *effect* is what the finding does to the verdict by default (`"
        + "` < `".join(EFFECTS) + "`); a rule may raise or lower it when it knows better "
        "(a stateless join may change freely, a stateful one may not), and "
        "`--allow-migration` turns a `migrate` error into a warning. The *upgrade type* is "
        "ksqlDB's taxonomy (" + ", ".join(f"`{t}`" for t in UPGRADE_TYPES) + "). "
        "See [Check and verdicts](../check.md) for how findings become a verdict and an "
        "exit code.",
        "",
        f"{len(codes)} codes.",
        "",
        "| code | effect | severity | upgrade type | what to do |",
        "|---|---|---|---|---|",
    ]
    for code in sorted(codes):
        effect, severity, utype, hint = codes[code]
        lines.append(f"| `{code}` | {effect} | {severity} | {utype} | {_cell(hint)} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """The generated pages by their path under docs/."""
    return {CLI_PAGE: cli_reference(), FINDINGS_PAGE: finding_catalogue()}
