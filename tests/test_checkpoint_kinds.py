"""Checkpoints of both kinds (issue 28 item 3): written by the gated source (``theseus run``)
or by Spark's own Kafka connector (a PySpark job), and the restart's dry run in the form
that wrote them.

``fixtures/checkpoints/join_ss_kinds`` holds real checkpoints written by Spark 4.3 for
``upgrades/join_stream_stream_source_column_added_unread``'s old plan (its topics renamed as
``theseus prove`` renames them; logs, operator metadata and schema files only), and the dry
runs of its new plan in both forms, as ``migrate.stateops.plan_operators`` planned them:

* ``connector``: the old plan run as its exported PySpark job (``prove --runtime spark``);
* ``gated``: the old plan run by ``theseus run``'s builders (``prove --runtime theseus``);
* ``dryrun_job`` / ``dryrun_theseus``: the new plan's empty micro-batch in each form.

Spark restarts the new plan correctly on both checkpoints (bench/results/truth.md, and
tests/integration/test_prove.py::test_join_prediction_on_both_kinds_of_checkpoint): the
builders' join state holds key columns of their own (``__theseus_lk0``) that the job's
does not, so the prediction is right only when the dry run's form is the checkpoint's.
"""

from __future__ import annotations

import shutil

import pytest

from compat.check import load_plan
from compat.checkpoint import read_checkpoint
from compat.checkpoint_check import compare, predict
from tests.conftest import FIXTURES

KINDS = FIXTURES / "checkpoints" / "join_ss_kinds"
PAIR = "upgrades/join_stream_stream_source_column_added_unread"


def test_a_checkpoint_says_which_source_wrote_it(tmp_path):
    assert read_checkpoint(KINDS / "connector").written_by == "kafka-connector"
    assert read_checkpoint(KINDS / "gated").written_by == "gated"
    assert read_checkpoint(FIXTURES / "checkpoints" / "agg_dedup").written_by == "gated"
    # the connector's starting offsets are what tells it: the same offsets without them
    # are the gated source's
    bare = tmp_path / "bare"
    shutil.copytree(KINDS / "connector", bare)
    shutil.rmtree(bare / "sources")
    assert read_checkpoint(bare).written_by == "gated"
    # offsets of another source (not topic -> partition -> offset)
    other = tmp_path / "other"
    shutil.copytree(KINDS / "gated", other)
    for f in (other / "offsets").iterdir():
        lines = f.read_text().splitlines()
        f.write_text("\n".join(lines[:2] + ['{"rate": 3}'] * (len(lines) - 2)) + "\n")
    assert read_checkpoint(other).written_by == "other"
    assert read_checkpoint(KINDS / "connector").to_json()["written_by"] == "kafka-connector"


@pytest.mark.parametrize("kind,form", [("connector", "dryrun_job"),
                                       ("gated", "dryrun_theseus")])
def test_the_matching_dry_run_predicts_sparks_restart(kind, form):
    """join_stream_stream_source_column_added_unread: Spark starts on both kinds."""
    ck = read_checkpoint(KINDS / kind)
    fs = compare(ck, read_checkpoint(KINDS / form), load_plan(str(KINDS / kind / "new.json")))
    assert fs == [] and predict(fs).outcome == "starts"


@pytest.mark.parametrize("kind,form", [("connector", "dryrun_theseus"),
                                       ("gated", "dryrun_job")])
def test_the_other_form_mispredicts_a_value_schema_change(kind, form):
    """What the prediction said before issue 28 item 3 on the connector's checkpoint:
    STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE, while Spark restarts correctly."""
    ck = read_checkpoint(KINDS / kind)
    fs = compare(ck, read_checkpoint(KINDS / form), load_plan(str(KINDS / kind / "new.json")))
    assert {f.code for f in fs} == {"checkpoint-value-schema-incompatible"}
    assert predict(fs).error_class == "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
    assert any("__theseus_lk0" in f.message for f in fs)


@pytest.mark.parametrize("kind,form,verdict", [("connector", "job", "in_place"),
                                               ("gated", "theseus", "in_place")])
def test_check_checkpoint_dry_runs_the_form_that_wrote_it(monkeypatch, kind, form, verdict):
    """``check --checkpoint`` on PAIR's old checkpoint of each kind: the dry run it asks
    for is the checkpoint's form (Spark stubbed with what it planned in that form)."""
    import migrate.stateops
    from migrate.ckcheck import check_checkpoint

    asked = []

    def dry_run(plan, spark=None, shuffle_partitions=None, timeout=300.0, conf=None,
                form="theseus"):
        asked.append((plan.query, shuffle_partitions, form))
        return read_checkpoint(KINDS / f"dryrun_{form}")

    monkeypatch.setattr(migrate.stateops, "plan_operators", dry_run)
    rep = check_checkpoint(str(KINDS / kind), str(KINDS / kind / "new.json"), spark=object())
    assert asked == [("paid_orders", 8, form)]
    assert rep.checkpoint["restart"]["outcome"] == "starts", rep.checkpoint["restart"]
    assert rep.verdict == verdict
    assert rep.checkpoint["written_by"] == ("kafka-connector" if kind == "connector"
                                            else "gated")


def test_a_plan_no_job_can_say_is_dry_run_by_the_builders():
    from migrate.ckcheck import dry_run_form

    ck = read_checkpoint(KINDS / "connector")
    plan = load_plan(str(KINDS / "connector" / "new.json"))
    assert dry_run_form(ck, plan) == "job"
    table = load_plan(str(FIXTURES / "upgrades" / "filter_changed_table_join" / "new.json"))
    assert dry_run_form(ck, table) == "theseus"
    assert dry_run_form(read_checkpoint(KINDS / "gated"), plan) == "theseus"


class _FakeReader:
    def __init__(self) -> None:
        self.fmt, self.opts = None, {}

    def format(self, f):
        self.fmt = f
        return self

    def options(self, **kw):
        self.opts.update(kw)
        return self

    def load(self):
        return (self.fmt, self.opts)


class _FakeSpark:
    conf = "the session's conf"

    @property
    def readStream(self):  # noqa: N802
        return _FakeReader()


def test_a_job_reads_the_runs_topics_and_broker():
    from migrate.jobsession import JobSession, redirected

    s = JobSession(_FakeSpark(), redirected("b:1", {"orders": "run-orders"}))
    fmt, opts = (s.readStream.format("kafka").option("kafka.bootstrap.servers", "x:9")
                 .option("subscribe", "orders,other").load())
    assert fmt == "kafka" and opts == {"kafka.bootstrap.servers": "b:1",
                                       "subscribe": "run-orders,other"}
    assert s.conf == "the session's conf"
    fmt, opts = s.readStream.format("rate").option("rowsPerSecond", 3).load()
    assert (fmt, opts) == ("rate", {"rowsPerSecond": "3"})
