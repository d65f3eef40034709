"""The docs site builds in strict mode, and its generated pages cover the CLI and the codes.

``mkdocs build --strict`` fails on a broken link, a missing page or an unknown anchor
(mkdocs.yml's ``validation``); the CLI reference and the finding catalogue are written by the
build's hook (``migrate.docgen``), so a command or a code without docs fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate import docgen
from migrate.cli import main
from tests.conftest import ROOT

# what `pip install -e '.[dev]'` brings; not a skip: a missing tool must not pass silently
MISSING = "mkdocs and mkdocs-material are missing: install the dev extra " \
          "(pip install -e '.[dev]', as make does)"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail(MISSING)
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # no --quiet: it hides the warnings from the count that --strict fails on
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    assert "WARNING" not in log, log
    return out


def _text(page: Path) -> str:
    return unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _help_commands(args: list[str]) -> list[str]:
    """The commands ``theseus ARGS --help`` lists, with their subcommands, walked through
    the help output itself rather than the click objects."""
    r = CliRunner().invoke(main, [*args, "--help"])
    assert r.exit_code == 0, r.output
    section = r.output.split("\nCommands:\n", 1)
    if len(section) == 1:
        return []
    found = []
    for line in section[1].splitlines():
        if not line.startswith("  ") or line.startswith("   "):
            break
        name = line.split()[0]
        found.append(" ".join(["theseus", *args, name]))
        found += _help_commands([*args, name])
    return found


def test_the_site_builds_strict_with_every_page_of_the_nav(site):
    for page in ("check", "sql", "pyspark", "fleets", "run", "recursion", "migrations",
                 "checkpoints", "clusters", "ci", "benchmarks", "design", "exit-codes",
                 "reference/cli", "reference/findings"):
        assert (site / page / "index.html").is_file(), page


def test_the_cli_page_names_every_command_the_help_lists(site):
    listed = _help_commands([])
    assert {"theseus check", "theseus migrate start", "theseus plan import"} <= set(listed)
    assert sorted(listed) == sorted(docgen.commands())
    page = _text(site / "reference" / "cli" / "index.html")
    missing = [c for c in listed if f"{c}¶" not in page and f"\n{c}\n" not in page]
    assert not missing, f"commands without a section in the CLI reference: {missing}"


def test_the_cli_page_carries_every_option_and_its_help(site):
    """Each option of each command appears with the first words of its help."""
    import click

    page = _text(site / "reference" / "cli" / "index.html")

    def walk(cmd: click.Command, ctx: click.Context):
        for p in cmd.get_params(ctx):
            if isinstance(p, click.Option) and not p.hidden:
                assert p.opts[0] in page, (ctx.command_path, p.opts[0])
                if p.help:
                    words = " ".join(p.help.split()[:4])
                    assert words in " ".join(page.split()), (ctx.command_path, words)
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub, click.Context(sub, info_name=name, parent=ctx))

    walk(main, click.Context(main, info_name="theseus"))


def _codes_in_source() -> set[str]:
    """Every finding code registered anywhere under compat/, read from the source text so
    that a code in a module the generator forgot to import is still found."""
    # "code": ("effect", "severity", ...: the shape of CODES and of every register_codes dict
    pattern = re.compile(r'"([a-z][a-z0-9-]*)":\s*\(\s*"(?:none|in_place|migrate|unsupported)",'
                         r'\s*"(?:error|warning|info)"')
    codes: set[str] = set()
    for path in (ROOT / "compat").rglob("*.py"):
        codes |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return codes


def test_the_finding_catalogue_lists_every_code(site):
    from compat.findings import CODES

    codes = _codes_in_source()
    assert set(CODES) <= codes and len(codes) > 100, "the code pattern no longer matches"
    page = _text(site / "reference" / "findings" / "index.html")
    missing = sorted(c for c in codes if f"\n{c}\n" not in page)
    assert not missing, f"finding codes missing from the catalogue: {missing}"


def test_the_generated_pages_follow_the_code():
    """A command and a code added at run time show up in the generated text."""
    import click

    from compat.findings import CODES

    @click.group()
    def g() -> None:
        """A group."""

    @g.command(help="Does the new thing.")
    @click.option("--frob", metavar="N", help="How much to frob.")
    @click.option("--level", default=3, help="How high.")
    @click.option("--loud", is_flag=True, help="Shout.")
    def newcmd(frob, level, loud) -> None: ...

    text = docgen.cli_reference(g)
    assert "`theseus newcmd`" in text and "Does the new thing." in text
    assert "| `--frob N` | How much to frob. |" in text
    assert "| `--level INTEGER` | How high. [default: 3] |" in text
    assert "| `--loud` | Shout. |" in text
    CODES["zz-test-code"] = ("migrate", "error", "topology", "Do a | b.")
    try:
        assert "| `zz-test-code` | migrate | error | topology | Do a \\| b. |" in \
            docgen.finding_catalogue()
    finally:
        del CODES["zz-test-code"]


def test_the_readme_fits_on_a_few_screens_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert "docs/design.md" in local
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_nothing_refers_to_files_outside_the_repository():
    found = []
    skip = {".git", ".venv", ".cache", "site", "build"}
    # walked with the skipped folders pruned, not rglob'd and filtered: a running broker's
    # log folders under .cache come and go while the walk lists them
    for folder, dirs, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".txt"}:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if "../shared/" in text or "DESIGN.md" in text:
                found.append(str(path.relative_to(ROOT)))
    assert found == [str(Path("tests/test_docs.py"))]
