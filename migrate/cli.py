"""The ``theseus`` command line: thin, and the one place where errors become exit codes.

Only ``click`` and ``compat`` are imported at module level: ``theseus check`` is a CI gate
and must not pay for Spark or Kafka clients.  Commands that run queries import them lazily.
"""

from __future__ import annotations

import os
import sys

import click

from compat import exits
from compat.errors import InvalidRequest, TheseusError
from compat.legend import LEGEND

FORMATS = ("text", "json", "markdown", "sarif", "github")

CHECK_HELP = """Compare two execution plans and say how the upgrade can be deployed.

\b
Verdicts and exit codes:
  identical    0  same plan modulo formatting, ids and metadata
  in_place     0  restart the new plan on the old checkpoint
  migrate      1  state is incompatible: needs a live migration (0 with --allow-migration)
  unsupported  3  cannot be done live on the same output
  (invalid)    2  unreadable file, malformed JSON, schema violation, dangling input, cycle...

\b
OLD and NEW are JSON plans, Spark SQL scripts (.sql, compiled on the fly; findings
then point at the SQL line and column) or PySpark job files (.py, or FILE.py:FUNCTION
for a builder other than build; imported under Spark, which needs the runtime extra
and Java 17).  Under --against, PATH... may hold all three.

\b
With --against REF, every plan file under PATH... is compared with its version at the
git ref REF: new plans are reported as new, deleted ones as removed (exit 1: the query
must be stopped by hand), and the exit code is the worst outcome over all files (an
invalid plan, 2, counts as the worst).  The report starts with a one-line summary and
lists only the plans that changed.

\b
With --checkpoint DIR NEW (or --query NAME --state STORE NEW: the query's checkpoint and
recorded plan from the store), NEW is checked against a Spark checkpoint: its operators,
state schemas, shuffle partitions and sources, as Spark checks them at restart; the report
has a `checkpoint` section saying whether a restart fails (with Spark's error class), runs
on wrong state or starts.  Only this form starts Spark (a dry run of NEW on empty input).

\b
--require takes a comma-separated list of environment requirements:
  backfill      output must be as if the new query had always run
  cascading     the output feeds other queries: key, mode and schema stay compatible
  exactly_once  the new sink must deliver exactly once
  ordered       one offset vector separates old and new output
  live          no output stall beyond a few trigger intervals

\b
""" + LEGEND


#: the exit code of a crash: never 1 (``migrate``) nor another verdict, so that a CI job
#: cannot read a bug as an answer; 2 is "no answer", as for invalid input
INTERNAL_ERROR_EXIT = 2


class TheseusGroup(click.Group):
    """Turns TheseusError into one line on stderr and its exit code: never a traceback.

    Anything else that escapes a command is a bug: it becomes one line saying "internal
    error" with exit code 2, and the traceback goes to a file that the line names."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except TheseusError as e:
            click.echo(_printable(_redacted(f"theseus: error: {e.render()}")), err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("theseus: interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise  # click's own: usage errors (exit 2), --help, ctx.exit
        except BrokenPipeError:
            # The reader went away (`theseus plan show big.json | head`): nothing to report
            # to, and Python would complain again when it flushes stdout at exit.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            ctx.exit(INTERNAL_ERROR_EXIT)
        except ModuleNotFoundError as e:
            line = missing_runtime(e, sys.argv[1:])
            if line is None:
                click.echo(_printable(_redacted(f"theseus: internal error: {_crash_line(e)}")),
                           err=True)
            else:
                click.echo(line, err=True)
            ctx.exit(INTERNAL_ERROR_EXIT)
        except Exception as e:  # the one place where a crash becomes an exit code
            click.echo(_printable(_redacted(f"theseus: internal error: {_crash_line(e)}")),
                       err=True)
            ctx.exit(INTERNAL_ERROR_EXIT)


#: the modules of the ``runtime`` extra (``pyproject.toml``): Spark and the Kafka client, and
#: what PySpark's pandas-based state uses (protobuf's is ``google.protobuf``)
RUNTIME_MODULES = frozenset({"pyspark", "py4j", "confluent_kafka", "pandas", "pyarrow",
                             "google"})
RUNTIME_INSTALL = "pip install 'theseus[runtime]'"


def missing_runtime(e: ModuleNotFoundError, argv: list[str]) -> str | None:
    """The one line for a command that needs the ``runtime`` extra where it is not
    installed (``pip install theseus`` is the offline gate alone: check, plan, fleet), or
    None when the missing module is not one of the extra's (a bug)."""
    top = (e.name or "").split(".")[0]
    if top not in RUNTIME_MODULES:
        return None
    return (f"theseus: error: `theseus {command_name(argv)}` needs the runtime extra "
            f"(Spark and the Kafka client; no module named '{e.name}' here): "
            f"{RUNTIME_INSTALL}")


def command_name(argv: list[str]) -> str:
    """The command that ``argv`` runs, as its words (``plan import``, ``run``)."""
    words: list[str] = []
    cmd: click.Command = main
    for arg in argv:
        if arg.startswith("-") or not isinstance(cmd, click.Group):
            continue
        sub = cmd.commands.get(arg)
        if sub is None:
            break
        words.append(arg)
        cmd = sub
    return " ".join(words) or "theseus"


def version_text() -> str:
    """``theseus --version``: this build's version and the plan format it reads and writes,
    with the highest version of each step it knows (a plan with a higher one was written
    for a newer Theseus and is refused)."""
    from importlib.metadata import PackageNotFoundError, version

    from compat.model import STEPS
    from compat.serde import FORMAT

    try:
        mine = version("theseus")
    except PackageNotFoundError:  # run from a checkout that was never installed
        mine = "(not installed)"
    newer = sorted(f"{name} 1-{cls.max_version}" for name, cls in STEPS.items()
                   if cls.max_version > 1)
    steps = (", ".join(newer) + ", every other step 1") if newer else "every step 1"
    return (f"theseus {mine}\n"
            f"plan format: reads and writes {FORMAT} (step versions: {steps})")


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit(0)


def _redacted(text: str) -> str:
    """``text`` without the secrets of the Kafka settings this process loaded (none loaded:
    the module is not even imported)."""
    conf = sys.modules.get("gates.kafkaconf")
    return conf.redact(text) if conf is not None else text


def _use_kafka_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from gates.kafkaconf import use

    use(value)


def kafka_config_option(f):
    """``--kafka-config FILE`` (or ``$THESEUS_KAFKA_CONFIG``): librdkafka client settings
    for every Kafka client of the command (gates.kafkaconf)."""
    return click.option(
        "--kafka-config", envvar="THESEUS_KAFKA_CONFIG", default=None, metavar="FILE",
        expose_value=False, callback=_use_kafka_config,
        help="Kafka client properties (librdkafka names: security.protocol, "
             "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location...) for every "
             "client Theseus creates, on the driver and the executors "
             "(default: $THESEUS_KAFKA_CONFIG).")(f)


def lease_ttl_option(f):
    return click.option(
        "--lease-ttl", "lease_ttl", type=click.FloatRange(min=0, min_open=True),
        default=None, metavar="SECONDS",
        help="How long the queries stay paused for this migrator once it stops renewing its "
             "lease (killed, hung): then they write on and a resume pauses them again "
             "[default: $THESEUS_LEASE_TTL, else 15].")(f)


def _printable(text: str) -> str:
    """An error line that any terminal can take: a file name that is not UTF-8 (Python
    keeps its bytes as lone surrogates) is written with backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _crash_line(e: BaseException) -> str:
    """One line for a crash: what it was, and where its traceback was written."""
    import tempfile
    import traceback

    what = f"{type(e).__name__}: {e}".splitlines()[0][:200] if str(e) else type(e).__name__
    details = "".join(traceback.format_exception(e))
    try:
        # A new file per crash, kept (not an atomic replace of a known file: gates.files).
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", prefix="theseus-crash-",
                                         suffix=".txt", delete=False) as f:
            f.write(_redacted(f"theseus {' '.join(sys.argv[1:])}\n\n{details}"))
        where = f"details in {f.name}"
    except OSError:  # no writable temp dir: the traceback is all there is
        where = "details: " + details.replace("\n", " | ")
    return f"{what} ({where}); this is a bug in theseus, please report it with that file"


@click.group(cls=TheseusGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=exits.text())
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version,
              help="Show the version and the plan format versions it reads and writes.")
def main() -> None:
    """Theseus keeps never-ending Spark streaming queries correct while they change."""


@main.command(help=CHECK_HELP)
@click.argument("paths", nargs=-1, required=True, metavar="OLD NEW | PATH... | NEW")
@click.option("--against", "against", default=None, metavar="REF",
              help="Compare every plan under PATH... with its version at git REF (new and "
                   "removed plans are reported); the exit code is the worst outcome.")
@click.option("--checkpoint", "checkpoint", default=None, metavar="DIR",
              help="Check NEW against this Spark checkpoint directory (no old plan): what "
                   "Spark will say when NEW restarts on it.  Starts Spark (local).")
@click.option("--query", "query", default=None, metavar="NAME",
              help="Check NEW against the checkpoint and recorded plan of query NAME in "
                   "the store (--state).  Starts Spark (local).")
@click.option("--state", "state", default=".theseus", show_default=True, metavar="STORE",
              help="The store, with --query.")
@click.option("--require", "require", default="", metavar="LIST",
              help="backfill,ordered,exactly_once,live,cascading")
@click.option("--schema-compat", type=click.Choice(["forward", "backward", "full", "none"]),
              default="forward", show_default=True,
              help="Output schema rule: forward = consumers reading with the old schema "
                   "must still read new output.")
@click.option("--allow-migration", is_flag=True, help="Exit 0 on the migrate verdict.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text",
              show_default=True, help="Report format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to a file instead of stdout.")
@click.option("--kafka-config", "kafka_config", envvar="THESEUS_KAFKA_CONFIG", default=None,
              metavar="FILE", help="With --query on a Kafka store (kafka://...): the Kafka "
              "client properties to read it with (default: $THESEUS_KAFKA_CONFIG); a check "
              "of plans alone reads no file.")
@click.option("--registry", "registry", envvar="SCHEMA_REGISTRY_URL", default=None,
              metavar="URL", help="Also ask this schema registry (its Confluent-compatible "
              "API) whether an Avro output's subject accepts the new schema (default: "
              "$SCHEMA_REGISTRY_URL).")
def check(paths: tuple[str, ...], against: str | None, checkpoint: str | None,
          query: str | None, state: str, require: str, schema_compat: str,
          allow_migration: bool, fmt: str, output: str | None,
          kafka_config: str | None, registry: str | None) -> None:
    from compat.check import check_files, parse_require
    from compat.errors import CheckError
    from compat.report import render

    if checkpoint is not None or query is not None:
        if (checkpoint is None) == (query is None) or against is not None or len(paths) != 1:
            raise CheckError("a checkpoint check takes one plan: --checkpoint DIR NEW, or "
                             "--query NAME [--state STORE] NEW",
                             expected="one of --checkpoint, --query and one path",
                             found=f"{len(paths)} path(s)"
                             + (", --against" if against is not None else "")
                             + (", both --checkpoint and --query"
                                if checkpoint is not None and query is not None else ""))
        if query is not None:
            # the store may be a secured Kafka topic (a plan-only check loads no settings)
            from gates.kafkaconf import use

            use(kafka_config)
        # Only this path imports PySpark (lazily, in migrate.stateops).
        from migrate.ckcheck import check_checkpoint

        report = check_checkpoint(checkpoint, paths[0], query=query, state=state,
                                  require=parse_require(require),
                                  schema_compat=schema_compat,
                                  allow_migration=allow_migration)
        _emit(render(report, fmt), output)
        sys.exit(report.exit_code)
    if against is not None:
        from compat import gitcheck

        entries = gitcheck.check_against(against, list(paths), require=parse_require(require),
                                         schema_compat=schema_compat,
                                         allow_migration=allow_migration)
        _emit(gitcheck.render(entries, against, fmt, allow_migration), output)
        sys.exit(gitcheck.exit_code(entries, allow_migration))
    if len(paths) != 2:
        raise CheckError("check takes two plans (OLD NEW), or --against REF and paths",
                         expected="2 paths", found=f"{len(paths)}")
    old, new = paths
    client = None
    if registry:
        from compat.registry import RegistryClient

        client = RegistryClient(registry.rstrip("/"))
    report = check_files(old, new, require=parse_require(require),
                         schema_compat=schema_compat, allow_migration=allow_migration,
                         registry=client)
    text = render(report, fmt)
    _emit(text, output)
    code = report.exit_code  # 0 on migrate with --allow-migration
    global _HARD_EXIT
    _HARD_EXIT = True
    _KEEP.append(report)  # not freed while the stack unwinds: the exit skips it
    sys.exit(code)


def _emit(text: str, output: str | None) -> None:
    text = _printable(text)
    if output:
        write_output(output, text)
    else:
        click.echo(text, nl=False)


def write_output(path: str, text: str) -> None:
    """Write a report or a plan to ``path``; a folder that does not exist or a file that
    cannot be written is one error naming it."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        folder = os.path.dirname(path) or "."
        found = "no such folder" if not os.path.isdir(folder) else (e.strerror or str(e))
        raise TheseusError("cannot write the output file", file=path,
                           expected=f"a writable file (folder '{folder}' must exist)",
                           found=found) from None


@main.group()
def plan() -> None:
    """Inspect plans."""


@plan.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def plan_validate(paths: tuple[str, ...]) -> None:
    """Validate plan files (schema, graph, expressions, changelog modes)."""
    from compat.check import load_plan

    for p in paths:
        pl = load_plan(p)
        click.echo(f"{p}: ok ({len(pl.nodes)} nodes, sink '{pl.sink_id}', "
                   f"output [{pl.info[pl.sink_id].mode}])")


@plan.command("compile")
@click.argument("path", type=click.Path(allow_dash=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the plan to a file instead of stdout.")
def plan_compile(path: str, output: str | None) -> None:
    """Compile a Spark SQL script (CREATE TABLE ... USING kafka, one INSERT INTO or
    CREATE TABLE ... AS SELECT) into a validated theseus.plan/1 plan."""
    from compat.sql import compile_file, dumps

    _emit(dumps(compile_file(path)), output)


@plan.command("import")
@click.argument("target", metavar="FILE.py[:FUNCTION]")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the plan to a file instead of stdout.")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Partitions of every source topic (default: ask the broker the job "
                   "names, else 1).")
@click.option("--delivery", type=click.Choice(["at_least_once", "exactly_once"]),
              default=None, help="The sink's delivery (default: at_least_once, what "
                                 "Spark's Kafka sink gives).")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Ask this broker for partition counts instead of the job's.")
@kafka_config_option
def plan_import(target: str, output: str | None, partitions: int | None,
                delivery: str | None, bootstrap: str | None) -> None:
    """Import a PySpark job: FILE.py is imported and FUNCTION(spark) (default: build)
    returns the query's DataStreamWriter; nothing is started.  The analyzed logical plan
    Spark built becomes a validated theseus.plan/1 plan.  Importing runs the file's code."""
    from migrate.adopt import dumps, import_job

    _emit(dumps(import_job(target, partitions=partitions, delivery=delivery,
                           bootstrap=bootstrap)), output)


@plan.command("export")
@click.argument("path", type=click.Path())
@click.option("--pyspark", "as_pyspark", is_flag=True, required=True,
              help="Write the plan as a PySpark job (the only form so far).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the job to a file instead of stdout.")
def plan_export(path: str, as_pyspark: bool, output: str | None) -> None:
    """Write a plan (JSON or SQL) as a readable PySpark job whose build(spark) returns the
    same query's DataStreamWriter on Spark's own Kafka connector."""
    from compat.check import load_plan
    from compat.export import to_pyspark

    _emit(to_pyspark(load_plan(path)), output)


@plan.command("freeze")
@click.argument("cases", nargs=-1, type=click.Path(file_okay=False))
@click.option("--history", default="fixtures/history", show_default=True,
              type=click.Path(file_okay=False), help="Directory of history cases.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if some case needs a new version.")
def plan_freeze(cases: tuple[str, ...], history: str, check: bool) -> None:
    """Record a new version of each history case whose SQL compiles differently today (or
    has a draft query.sql/input.json/expected.json in its directory).  Versions live in
    HISTORY/<case>/v<N>/ and are never edited; make test builds and runs every one."""
    from pathlib import Path

    from compat.sql.history import cases as all_cases
    from compat.sql.history import freeze

    outcomes = [freeze(Path(c), check=check) for c in (cases or all_cases(Path(history)))]
    for o in outcomes:
        click.echo(o.line())
    if check and any(o.status != "unchanged" for o in outcomes):
        click.echo("theseus: run `theseus plan freeze` to record the new versions", err=True)
        sys.exit(1)


@plan.command("diff")
@click.argument("old", type=click.Path())
@click.argument("new", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True,
              help="text: each step paired, with the fields that changed, then the check's "
                   "report; json: the same for tools; html: a page drawing both plans.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the diff to a file instead of stdout.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the HTML page to this file (as --format html -o FILE).")
@click.option("--require", "require", default="", metavar="LIST",
              help="Environment requirements the check applies, as for check: "
                   "backfill,ordered,exactly_once,live,cascading.")
@click.option("--schema-compat", type=click.Choice(["forward", "backward", "full", "none"]),
              default="forward", show_default=True,
              help="Output schema rule, as for check: forward = consumers reading with the "
                   "old schema must still read new output.")
def plan_diff(old: str, new: str, fmt: str, output: str | None, html_out: str | None,
              require: str, schema_compat: str) -> None:
    """Compare two plans (JSON, SQL or PySpark jobs) step by step: every pair of steps the
    check matched (enforcing and passive) with the fields that changed, old -> new, and the
    steps added and removed; then the check's findings.  Exit code as for check."""
    from compat import plandiff
    from compat.check import check_files, parse_require
    from compat.htmldiff import render_html

    report = check_files(old, new, require=parse_require(require),
                         schema_compat=schema_compat, pair_passive=True)
    d = plandiff.diff(report)
    if html_out:
        _emit(render_html(report, d), html_out)
        click.echo(f"wrote {html_out}")
    _emit(render_html(report, d) if fmt == "html" else plandiff.render(d, fmt), output)
    sys.exit(report.exit_code)


@plan.command("show")
@click.argument("path", type=click.Path())
def plan_show(path: str) -> None:
    """Print the plan as a tree, sink at the top, with each step's class and changelog mode
    (the legend under the tree says what the marks mean)."""
    from compat.check import load_plan
    from compat.infer import characteristics

    pl = load_plan(path)
    click.echo(f"{pl.query}  ({', '.join(characteristics(pl))})")
    seen: set[str] = set()
    # Depth first from the sink, on a stack (a chain of 20,000 steps is deeper than Python's
    # recursion); past _SHOW_DEPTH levels the indent stops growing, or a long chain would
    # print lines as long as the chain.
    stack = [(pl.sink_id, "", True)]
    while stack:
        nid, indent, last = stack.pop()
        node = pl.nodes[nid]
        info = pl.info[nid]
        branch = "└─ " if last else "├─ "
        extra = " (see above)" if nid in seen else ""
        state = ", stateful" if info.stateful else ""
        click.echo(f"{indent}{branch}{nid}: {node.step} v{node.version} "
                   f"[{node.klass}{state}] [{info.mode}]{extra}")
        if nid in seen:
            continue
        seen.add(nid)
        child_indent = indent + ("   " if last else "│  ") \
            if len(indent) < 3 * _SHOW_DEPTH else indent
        for i, inp in reversed(list(enumerate(node.inputs))):
            stack.append((inp, child_indent, i == len(node.inputs) - 1))

    click.echo("")
    click.echo(LEGEND, nl=False)


#: levels of the tree ``plan show`` indents
_SHOW_DEPTH = 40


@main.group()
def fleet() -> None:
    """Many queries chained through Kafka topics, as one global plan."""


@fleet.command("show")
@click.argument("root", metavar="DIR", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True,
              help="text: queries upstream first, topics, external topics, cycles; json: "
                   "the same for tools (compat/schemas/fleet.v1.json); html: a page drawing the "
                   "global graph.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write to a file instead of stdout.")
def fleet_show(root: str, fmt: str, output: str | None) -> None:
    """Print the global plan of the fleet under DIR: every *.json and *.sql plan in its
    tree is one query, and so is every *.py file that defines build(spark) (a PySpark job,
    imported under Spark); other *.py files are the modules the jobs import, skipped and
    counted.  A topic one query writes and another reads is an edge.  A file that is not
    a plan, two plans of one query name or two queries writing one topic: exit 2."""
    from compat.fleet.graph import load_fleet
    from compat.fleet.show import render

    _emit(render(load_fleet(root), fmt), output)


FLEET_CHECK_HELP = """Check a change to a fleet of queries: OLD_DIR NEW_DIR, or --against
REF DIR (the fleet under DIR against its version at git REF).

\b
Every changed query is checked as `theseus check` checks one plan; then every change is
carried across the topics to the queries that read them, transitively: what a producer
now writes (columns, types, key, changelog mode, format, topic) against what each
consumer's source declares and reads (findings upstream-* on the consumer, naming the
producer).  An output that queries of the fleet read is judged by them instead of by
--schema-compat; an output no query of the fleet reads keeps --schema-compat.  A query
rebuilt by a live migration takes the stateful queries reading it along (a cascading
migration): the report gives the migration waves, upstream first.

\b
Verdict and exit code: the worst query's, as for `theseus check` (0 identical or
in_place, 1 migrate, 3 unsupported); 2 for an invalid fleet (a file that is not a
plan, two queries writing one topic, two plans of one query name).
"""


@fleet.command("check", help=FLEET_CHECK_HELP)
@click.argument("dirs", nargs=-1, required=True, metavar="OLD_DIR NEW_DIR | DIR")
@click.option("--against", "against", default=None, metavar="REF",
              help="Compare the fleet under DIR with its version at git REF.")
@click.option("--require", "require", default="", metavar="LIST",
              help="backfill,ordered,exactly_once,live,cascading")
@click.option("--schema-compat", type=click.Choice(["forward", "backward", "full", "none"]),
              default="forward", show_default=True,
              help="Output schema rule for outputs that no query of the fleet reads.")
@click.option("--allow-migration", is_flag=True, help="Exit 0 on the migrate verdict.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text",
              show_default=True, help="Report format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to a file instead of stdout.")
def fleet_check(dirs: tuple[str, ...], against: str | None, require: str,
                schema_compat: str, allow_migration: bool, fmt: str,
                output: str | None) -> None:
    from compat.check import parse_require
    from compat.fleet.check import check_dirs
    from compat.fleet.report import render

    report = check_dirs(list(dirs), against=against, require=parse_require(require),
                        schema_compat=schema_compat, allow_migration=allow_migration)
    _emit(render(report, fmt), output)
    sys.exit(report.exit_code)


@fleet.command("optimize")
@click.argument("root", metavar="DIR", type=click.Path())
@click.option("-o", "--output", "out_dir", required=True, metavar="OUT_DIR",
              type=click.Path(), help="An empty or new folder for the rewritten fleet.")
def fleet_optimize(root: str, out_dir: str) -> None:
    """Rewrite the fleet under DIR so that every subplan that two or more queries compute
    is computed once, by a query writing an internal topic that they read."""
    from compat.fleet.optimize import optimize_dir, summary

    for line in summary(optimize_dir(root, out_dir), out_dir):
        click.echo(line)


@main.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path())
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", required=True, metavar="HOST:PORT",
              help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP).")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR",
              help="The store: plans, status, checkpoints and gate state.")
@click.option("--available-now", is_flag=True,
              help="Process everything currently in the source topics, then exit 0.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--trigger", "trigger_interval", default="1 second", show_default=True,
              help="Micro-batch interval when running continuously.")
@click.option("--instance", default=None, hidden=True)
@click.option("--generation", type=int, default=None, hidden=True)
@click.option("--gated-start", is_flag=True, hidden=True)
@click.option("--shadow-topic", default=None, hidden=True)
@kafka_config_option
def run(plan_path: str, bootstrap: str, state: str, available_now: bool, master: str,
        trigger_interval: str, instance: str | None, generation: int | None,
        gated_start: bool, shadow_topic: str | None) -> None:
    """Build the plan's Spark query and run it (Ctrl-C stops it after the current batch).
    PLAN is a JSON plan, a SQL script or a PySpark job (FILE.py[:FUNCTION], imported); the
    store records the plan with the path and digest of PLAN's file (theseus status)."""
    from migrate.run import run as run_plan

    sys.exit(run_plan(plan_path, bootstrap=bootstrap, state=state, master=master,
                      available_now=available_now, echo=click.echo,
                      trigger_interval=trigger_interval, instance=instance,
                      generation=generation, gated_start=gated_start,
                      shadow_topic=shadow_topic))


@main.command()
@click.argument("query")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the host to stop (exit 4 past them).")
@kafka_config_option
def stop(query: str, state: str, timeout: float) -> None:
    """Stop the host running QUERY after its current batch, and wait until it stopped.
    Exit 6 when it was not running (the line says why)."""
    from migrate.run import stop_host
    from migrate.store import open_store

    click.echo(stop_host(open_store(state), query, timeout))


@main.command("status")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: compat/schemas/status.v1.json.")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Ask this broker for the high watermarks (default: the one each query "
                   "runs with).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=3.0, show_default=True,
              help="Seconds to wait for a broker; without its answer the lag is unknown.")
@kafka_config_option
def status(state: str, fmt: str, bootstrap: str | None, timeout: float) -> None:
    """Every query in the store: its plan (file and digest), its host and whether that
    process is alive, its last batch and lag, and its migration with phase, owner and
    backfill.  Reads only."""
    from migrate.view import Heads, existing_store, render_text, snapshot, to_json

    doc = snapshot(existing_store(state), Heads(timeout, bootstrap))
    click.echo(to_json(doc) if fmt == "json" else render_text(doc), nl=False)


@main.command()
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True,
              help="Port on 127.0.0.1 (0: any free port, printed).")
@click.option("--refresh", type=click.FloatRange(min=0.5), default=2.0, show_default=True,
              help="Seconds between two refreshes of the page.")
@kafka_config_option
def serve(state: str, port: int, refresh: float) -> None:
    """Serve what `theseus status` shows, and the recent migrations and the fleet picture,
    as a read-only page on 127.0.0.1 that refreshes itself (Ctrl-C stops)."""
    from migrate.serve import serve as serve_store
    from migrate.view import existing_store

    sys.exit(serve_store(existing_store(state), port, refresh, echo=click.echo))


@main.command()
@click.argument("old", type=click.Path())
@click.argument("new", type=click.Path())
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, metavar="HOST:PORT",
              help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP; `make kafka` starts "
                   "a local broker).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the generated input (the same seed, the same input).")
@click.option("--records", type=click.IntRange(min=6), default=120, show_default=True,
              help="Records generated per source topic (two thirds before the restart).")
@click.option("--runtime", "runtime_name", type=click.Choice(["theseus", "spark"]),
              default="theseus", show_default=True,
              help="theseus: the plans run with `theseus run`'s builder (gated source and "
                   "sink); spark: as the plain PySpark jobs `plan export --pyspark` writes, "
                   "on Spark's own Kafka connector (its checkpoints hold that source's "
                   "offsets).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to a file instead of stdout.")
def prove(old: str, new: str, bootstrap: str | None, seed: int, records: int,
          runtime_name: str, fmt: str, output: str | None) -> None:
    """Restart NEW on OLD's checkpoint on local Spark and Kafka, and say whether Spark
    agrees with the verdict of `theseus check OLD NEW` (exit 0) or not (exit 7).

    \b
    OLD and NEW are JSON plans, SQL scripts or PySpark job files.  Input is generated
    from the plans' source schemas (seeded); OLD runs over two thirds of it in three
    micro-batches, NEW restarts on a copy of its checkpoint over the rest, and NEW from
    scratch over all of it is the reference.  The restart:
      fails           Spark refuses it (its error class and message)
      starts_correct  its output keeps the verdict's promise
      starts_wrong    it does not (a sample of the rows that differ)
    identical and in_place agree with starts_correct only; migrate and unsupported with
    fails or starts_wrong (a correct start is a conservative disagreement).  The JSON
    report has verdict, outcome, error_class, agrees, predicted (check --checkpoint on
    OLD's checkpoint), judged (what was compared), counts and timings."""
    if not bootstrap:
        raise TheseusError("prove runs the plans on Kafka: no broker given",
                           expected="--bootstrap HOST:PORT or $KAFKA_BOOTSTRAP",
                           found="neither", hint="`make kafka` starts a local broker and "
                                                 "prints its address")
    from migrate import prove as proving

    proof = proving.prove(old, new, proving.runtime(bootstrap, runtime_name), seed=seed,
                          records=records)
    _emit(proving.render(proof, fmt), output)
    sys.exit(proof.exit_code)


@main.group()
def migrate() -> None:
    """Live migrations of running queries (swap in place at one exact cut)."""


@migrate.command("start")
@click.argument("new_plans", nargs=-1, type=click.Path(), metavar="PLAN...")
@click.option("--fleet", "fleet_dir", type=click.Path(), metavar="NEW_DIR",
              help="Instead of PLANs: migrate every query of the fleet under NEW_DIR whose "
                   "plan is not the one it runs; changed queries chained through topics "
                   "together, as one cascade each.")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", required=True, metavar="HOST:PORT")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--strategy", type=click.Choice(["auto", "in-place", "shadow"]), default="auto",
              show_default=True)
@click.option("--require", "require", default="", metavar="LIST")
@click.option("--cut", "cut_mode", type=click.Choice(["control-events", "offsets"]),
              default="control-events", show_default=True)
@click.option("--compare", is_flag=True, help="Write the shadow's output to <output>.shadow.")
@click.option("--reconcile", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="At the hand-over, write what makes the compacted output the new plan over "
                   "all input (changed and missing keys, tombstones for dropped ones); auto: "
                   "on for keyed update sinks.")
@click.option("--master", default="local[2]", show_default=True)
@click.option("--trigger", default="1 second", show_default=True)
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds for the whole migration.")
@click.option("--dry-run", is_flag=True,
              help="Run the shadow to the head and report what the cutover would do "
                   "(rows the reconciliation would correct, add and delete, topics it would "
                   "create, control events it would write), without a cut: nothing is "
                   "written to the output or the source topics. Exit 6 when the delete "
                   "guard would refuse the migration.")
@click.option("--allow-deletes", is_flag=True,
              help="Let the reconciliation delete more than --max-delete-ratio of the "
                   "output's keys (without it, the migration stops before the cut).")
@click.option("--max-delete-ratio", type=click.FloatRange(0.0, 1.0), default=0.1,
              show_default=True,
              help="The largest share of the output's keys the reconciliation may delete "
                   "(counted at the pause, before the cut).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="json: the outcome (a dry run's report) as JSON on stdout; the phases "
                   "go to stderr.")
@lease_ttl_option
@kafka_config_option
def migrate_start(new_plans: tuple[str, ...], fleet_dir: str | None, bootstrap: str,
                  state: str, strategy: str, require: str, cut_mode: str, compare: bool,
                  reconcile: str, master: str, trigger: str, timeout: float, dry_run: bool,
                  allow_deletes: bool, max_delete_ratio: float, fmt: str,
                  lease_ttl: float | None) -> None:
    """Migrate the query named by PLAN's `query` to PLAN, live: a JSON plan, a SQL script
    or a PySpark job (FILE.py[:FUNCTION], imported once; the store keeps the plan it
    built).  Several plans chained through topics (an output topic another plan reads)
    are migrated together as one cascade, cut at one logical point of the chain.  With
    --fleet NEW_DIR, every query of the fleet whose plan changed (each migration with its
    own --timeout)."""
    import json

    from compat.check import load_plan, parse_require
    from migrate import migration
    from migrate.phases import preview
    from migrate.progress import Progress
    from migrate.store import open_store

    if bool(new_plans) == bool(fleet_dir):
        raise click.UsageError("give the new PLANs or --fleet NEW_DIR (one of the two)")
    if (dry_run or allow_deletes or fmt == "json") and (fleet_dir or len(new_plans) > 1):
        # a cascade's downstream is cut at its upstream's propagated cut: neither a dry run
        # nor the delete guard (of a single migration's pause) applies
        raise InvalidRequest("--dry-run, --allow-deletes and --format json take one plan",
                             expected="one PLAN", found="--fleet" if fleet_dir else
                             f"{len(new_plans)} plans")
    common = dict(bootstrap=bootstrap, cut_mode=cut_mode, require=parse_require(require),
                  compare=compare, reconcile=reconcile, master=master, trigger=trigger,
                  timeout=timeout, lease_ttl=lease_ttl)
    if fleet_dir:
        from migrate import fleet

        progress = Progress()
        try:
            done = fleet.start(open_store(state), fleet_dir, strategy=strategy, **common,
                               echo=progress, live=progress.live)
        finally:
            progress.close()
        for queries, phase in done:
            click.echo(f"theseus: {' -> '.join(queries)} {phase}")
        return
    if len(new_plans) > 1:
        from migrate import cascade

        if strategy == "in-place":
            raise click.UsageError("a cascade migrates every query through a shadow query: "
                                   "--strategy in-place does not apply")
        progress = Progress()
        try:
            c = cascade.start(open_store(state), list(new_plans), **common,
                              echo=progress, live=progress.live)
        finally:
            progress.close()
        click.echo(f"theseus: cascade {c.id} {c.phase}: " + ", ".join(
            f"'{x['query']}' {x['phase']}" for x in c.members))
        return
    new_plan = new_plans[0]
    plan = load_plan(new_plan)
    progress = Progress(sys.stderr if fmt == "json" else None)
    try:
        m = migration.start(open_store(state), plan.query, new_plan, plan=plan,
                            strategy=strategy, **common, echo=progress, live=progress.live,
                            dry_run=dry_run, allow_deletes=allow_deletes,
                            max_delete_ratio=max_delete_ratio)
    finally:
        progress.close()
    if dry_run:
        if fmt == "json":
            click.echo(json.dumps(preview.report(m), indent=2))
        refusal = preview.would_refuse(m)
        if refusal is not None:
            raise refusal
        if fmt == "text":
            click.echo(f"theseus: dry run {m.id}: the migration would go through; nothing "
                       "was cut or written")
        return
    if fmt == "json":
        click.echo(json.dumps({"migration": m.id, "query": m.query, "phase": m.phase,
                               "path": m.kind, "cut": m.cut, "counts": m.counts,
                               "delete_guard": m.guard}, indent=2))
        return
    click.echo(f"theseus: migration {m.id} {m.phase}: '{m.query}' runs the new plan "
               f"({m.kind})")


@migrate.command("status")
@click.argument("query")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--watch", is_flag=True,
              help="Follow the migration until it ends: its phases, and the shadow's "
                   "backfill as a progress bar (plain lines when not on a terminal).")
@kafka_config_option
def migrate_status(query: str, state: str, fmt: str, watch: bool) -> None:
    """Show the current migration of QUERY."""
    import json
    from dataclasses import asdict

    from migrate import migration
    from migrate.record import NoMigration
    from migrate.store import open_store

    store = open_store(state)
    try:
        if watch:
            from migrate.progress import Progress
            from migrate.progress import watch as follow

            progress = Progress()
            try:
                follow(store, query, progress)
            finally:
                progress.close()
        m = migration.current(store, query)
    except NoMigration:  # nothing to show is not a failure (0)
        click.echo("null" if fmt == "json" else f"query '{query}': no migration")
        return
    if m.cascade:
        from migrate.cascade import Cascade

        c = Cascade.load(store, m.cascade)
        if fmt == "json":
            click.echo(json.dumps(asdict(c), indent=2))
            return
        click.echo(f"cascade {c.id}: {c.phase} (" + " -> ".join(c.queries) + ")")
        for x in c.members:
            line = f"  {x['query']}: migration {x['migration']}, phase {x['phase']}"
            if x.get("cut"):
                line += f", cut {json.dumps(x['cut'])}"
            if x.get("out_cut"):
                line += f", propagated {json.dumps(x['out_cut'])}"
            c_ = x.get("counts") or {}
            if c_:
                line += (f", reconciled {c_.get('corrected', 0)} corrected, "
                         f"{c_.get('added', 0)} added, {c_.get('deleted', 0)} deleted, "
                         f"{c_.get('matched', 0)} already right")
            click.echo(line)
        if c.error:
            click.echo(f"  error: {c.error}")
        return
    from migrate.view import Heads, migration_status, render_migration_text, to_json

    view = migration_status(store, m, Heads(3.0))
    if fmt == "json":
        click.echo(to_json(view), nl=False)
        return
    click.echo(f"migration {m.id} of '{m.query}': phase {m.phase} ({m.kind or 'undecided'}, "
               f"verdict {m.verdict or '-'})")
    click.echo(f"  old {m.old_instance} -> new {m.new_instance}")
    if m.cut:
        click.echo(f"  cut C = {json.dumps(m.cut)}")
    for side, mark in (("old", "C'"), ("new", "C''")):  # a recursive query's loop topics
        if set(m.output_cuts.get(side) or {}) - set(m.cut):
            click.echo(f"  {side} output query cut at {mark} = "
                       f"{json.dumps(m.output_cuts[side])}")
    if m.reconciling:
        c = m.counts
        click.echo("  reconciliation: " + (
            f"{c.get('corrected', 0)} corrected, {c.get('added', 0)} added, "
            f"{c.get('deleted', 0)} deleted, {c.get('matched', 0)} already right"
            if c else "pending (at the hand-over)"))
    if m.error:
        click.echo(f"  error: {m.error}")
    for line in render_migration_text(view):
        click.echo(line)


@migrate.command("history")
@click.argument("query")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@kafka_config_option
def migrate_history(query: str, state: str, fmt: str) -> None:
    """The migrations of QUERY, oldest first: outcome (done, aborted, refused, running),
    when, verdict, plans, cut and reconciliation."""
    import json

    from migrate.history import history, render_text
    from migrate.view import existing_store

    doc = history(existing_store(state), query)
    click.echo(json.dumps(doc, indent=2) + "\n" if fmt == "json" else render_text(doc),
               nl=False)


@migrate.command("rollback")
@click.argument("query")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", default=None, metavar="HOST:PORT",
              help="Default: $KAFKA_BOOTSTRAP, else the broker of the migration undone.")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--strategy", type=click.Choice(["auto", "in-place", "shadow"]), default="auto",
              show_default=True)
@click.option("--reconcile", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True)
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds for the whole migration.")
@kafka_config_option
def migrate_rollback(query: str, bootstrap: str | None, state: str, strategy: str,
                     reconcile: str, timeout: float) -> None:
    """Migrate QUERY live back to the plan it ran before its last done migration: a
    migration like `migrate start` (same phases, checks and guards).  Refused (exit 6)
    while a migration of QUERY runs, or when there is no plan to go back to."""
    from migrate.history import rollback
    from migrate.progress import Progress
    from migrate.view import existing_store

    progress = Progress()
    try:
        last, m = rollback(existing_store(state), query, bootstrap=bootstrap,
                           strategy=strategy, reconcile=reconcile, timeout=timeout,
                           echo=progress, live=progress.live)
    finally:
        progress.close()
    click.echo(f"theseus: migration {m.id} {m.phase}: '{m.query}' runs the plan it ran "
               f"before migration {last.id} again ({m.kind})")


@migrate.command("resume")
@click.argument("query")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@click.option("--timeout", type=float, default=600.0, show_default=True)
@lease_ttl_option
@kafka_config_option
def migrate_resume(query: str, state: str, timeout: float, lease_ttl: float | None) -> None:
    """Continue QUERY's migration from its last recorded phase (refused while another live
    process runs it)."""
    from migrate import migration
    from migrate.progress import Progress
    from migrate.store import open_store

    progress = Progress()
    try:
        m = migration.resume(open_store(state), query, echo=progress, live=progress.live,
                             timeout=timeout, lease_ttl=lease_ttl)
    finally:
        progress.close()
    click.echo(f"theseus: migration {m.id} {m.phase}")


@migrate.command("abort")
@click.argument("query")
@click.option("--state", default=".theseus", show_default=True, metavar="DIR")
@kafka_config_option
def migrate_abort(query: str, state: str) -> None:
    """Roll QUERY's migration back (before its cutover): the old query keeps running.  A
    migrator still running it is stopped first (it loses the migration's lease)."""
    from migrate import migration
    from migrate.store import open_store

    m = migration.abort(open_store(state), query, echo=click.echo)
    click.echo(f"theseus: migration {m.id} {m.phase}")


#: set once a check has written its report: nothing is left to clean up, and freeing two
#: large plans object by object at interpreter exit costs as much as comparing them
_HARD_EXIT = False
_KEEP: list[object] = []


def entry() -> None:
    """The ``theseus`` command: ``main``, then, after a check, an exit that skips tearing
    down the heap (as mypy does); every other command exits normally (Spark and Kafka
    clients have cleanup of their own to run)."""
    try:
        main()
    except SystemExit as e:
        if not _HARD_EXIT:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)


if __name__ == "__main__":  # pragma: no cover
    entry()
