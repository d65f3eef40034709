"""The exit codes of every ``theseus`` command: one table, the one place they are written.

``theseus --help`` shows it (:func:`text`), the README carries it (:func:`markdown`, a test
compares them), and ``tests/test_exit_codes.py`` walks it: every situation listed here is
brought about and must end with its row's code.  The codes themselves come from the
exception classes (:mod:`compat.errors`, ``exit_code``); the CLI turns an error into its
code in one place."""

from __future__ import annotations

from typing import NamedTuple


class Exit(NamedTuple):
    code: int
    meaning: str
    #: situations that end with this code, each "command: situation"
    cases: tuple[str, ...]


EXITS: tuple[Exit, ...] = (
    Exit(0, "success; also nothing to show or nothing left to do", (
        "check: the verdict is identical or in_place",
        "migrate start: the migration is done",
        "migrate start --dry-run: the migration would go through",
        "migrate status: the query has no migration (it says so)",
        "status: the store's queries are listed (none: it says so)",
        "migrate history: the query's past migrations are listed (none: it says so)",
        "migrate abort: the migration is aborted, or had already ended aborted",
        "stop: the query stopped after its batch",
        "prove: Spark agrees with the verdict and the predicted restart")),
    Exit(1, "the upgrade needs a live migration (0 with --allow-migration), or a plan was "
            "removed", (
        "check: the verdict is migrate",
        "check --against: a plan was removed (its query must be stopped by hand; also with "
        "--allow-migration)")),
    Exit(2, "invalid input or usage; also an internal error (its line names the file "
            "that holds the traceback)", (
        "check: a plan that cannot be read or is invalid",
        "check --against: a path in neither the work tree nor REF, or one that holds no plan",
        "fleet show: a folder that holds no plan; fleet check: no plan on either side",
        "migrate status: a query the store does not know",
        "status: no store at --state",
        "migrate start: flags the upgrade contradicts (--strategy in-place for a "
        "migrate verdict)",
        "migrate start: --dry-run with several plans")),
    Exit(3, "unsupported: the upgrade cannot be done live on the same output", (
        "check: the verdict is unsupported",
        "migrate start: the checker says unsupported")),
    Exit(4, "a runtime failure outside a migration step: Kafka, Spark or the store", (
        "run: the query failed",
        "migrate status: the store cannot be opened",
        "stop: the query's host is still running after --timeout")),
    Exit(5, "a migration step failed; its phase is recorded: migrate resume retries it, "
            "migrate abort rolls back", (
        "migrate resume: a step fails (a broker that does not answer within --timeout)",)),
    Exit(6, "refused before anything changed, by the state found; nothing to undo", (
        "migrate start: a source topic of the new plan does not exist",
        "migrate start, resume: at the pause, the reconciliation would delete more than "
        "--max-delete-ratio of the output's keys (without --allow-deletes)",
        "migrate start: retention has deleted history the new stateful plan needs",
        "migrate start --dry-run: the migration would be refused by the delete guard",
        "migrate start: another migration of the query is in progress",
        "migrate resume: the query has no migration",
        "migrate resume: the migration has ended (done, aborted or refused)",
        "migrate abort: the query has no migration",
        "migrate rollback: a migration of the query runs, or no plan before it was kept",
        "migrate abort: the migration is past its point of no return (resume finishes it)",
        "run: a source topic does not exist, or the output topic cannot be created",
        "stop: the query is not running",
        "prove: a plan whose input prove cannot generate (a recursive step), or a "
        "nondeterministic new plan",
        "prove --runtime spark: a plan no PySpark job can say (a top-N)")),
    Exit(7, "Spark disagrees: the real restart contradicts the verdict (a false green, or "
            "a conservative migrate/unsupported) or the predicted restart", (
        "prove: an in_place verdict whose restart breaks its promise",)),
    Exit(8, "inconclusive: Spark restarts, but the proof compared no row, so it neither "
            "confirms nor contradicts the verdict (never a success, never a false green)", (
        "prove: a restart whose generated input leaves no output to compare (a vacuous "
        "proof)",)),
    Exit(130, "interrupted (Ctrl-C)", (
        "migrate start: interrupted",)),
)


def text() -> str:
    """The table as ``theseus --help`` shows it (click keeps ``\\b`` paragraphs as they
    are)."""
    lines = ["\b", "Exit codes (every command):"]
    for e in EXITS:
        lines.append(f"  {e.code:<4} {e.meaning}")
        lines += [f"         - {c}" for c in e.cases]
    return "\n".join(lines)


def markdown() -> str:
    """The table as the README carries it."""
    rows = ["| code | meaning | for example |", "|---|---|---|"]
    for e in EXITS:
        rows.append(f"| {e.code} | {e.meaning} | " + "<br>".join(e.cases) + " |")
    return "\n".join(rows) + "\n"
