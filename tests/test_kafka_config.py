"""--kafka-config: the client properties file, its checks, and where its settings go.

No broker is needed: librdkafka judges names and values without connecting, and the
builder's source options and the sink's client settings are read without starting Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gates import kafkaconf
from gates.kafkaconf import KafkaConfigError

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-Pa55word"

GOOD = f"""# a client.properties with librdkafka's names
security.protocol = SASL_PLAINTEXT
sasl.mechanism: SCRAM-SHA-512
sasl.username=alice
sasl.password={SECRET}
! another comment style
socket.timeout.ms=\\
  30000
"""


@pytest.fixture(autouse=True)
def _no_active_config(monkeypatch):
    monkeypatch.delenv(kafkaconf.ENV, raising=False)
    kafkaconf.use(None)
    yield
    kafkaconf.use(None)


def test_parse_reads_java_properties_syntax():
    conf = kafkaconf.parse(GOOD)
    assert conf == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "alice", "sasl.password": SECRET,
                    "socket.timeout.ms": "30000"}


@pytest.mark.parametrize("name, hint", [
    ("sasl.jaas.config", "sasl.username and sasl.password"),
    ("ssl.truststore.location", "ssl.ca.location"),
])
def test_java_only_names_are_refused_with_the_librdkafka_name(name, hint):
    with pytest.raises(KafkaConfigError) as e:
        kafkaconf.parse(f"security.protocol=SASL_SSL\n{name}=x y z\n", "client.properties")
    text = e.value.render()
    assert "client.properties" in text and "line 2" in text and hint in text


@pytest.mark.parametrize("name", ["bootstrap.servers", "transactional.id", "group.id",
                                  "enable.idempotence", "isolation.level"])
def test_names_theseus_sets_are_refused(name):
    with pytest.raises(KafkaConfigError, match="set by Theseus"):
        kafkaconf.parse(f"{name}=x\n")


def test_a_line_without_value_separator_is_refused_without_showing_a_secret():
    with pytest.raises(KafkaConfigError) as e:
        kafkaconf.parse("sasl.password\n")
    assert "line 1" in e.value.render()


def test_librdkafka_refuses_an_unknown_name_and_a_bad_value(tmp_path):
    f = tmp_path / "c.properties"
    f.write_text("sasl.usernme=alice\n")
    with pytest.raises(KafkaConfigError, match="sasl.usernme"):
        kafkaconf.load(f)
    f.write_text(f"security.protocol=SASL_PLAINTEXTT\nsasl.password={SECRET}\n")
    with pytest.raises(KafkaConfigError) as e:
        kafkaconf.load(f)
    assert "security.protocol" in e.value.render() and SECRET not in e.value.render()


def test_secret_names():
    for name in ("sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem",
                 "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config"):
        assert kafkaconf.is_secret(name), name
    for name in ("sasl.username", "ssl.key.location", "security.protocol", "ssl.ca.location"):
        assert not kafkaconf.is_secret(name), name


def test_redact_replaces_every_secret_value():
    conf = {"sasl.password": SECRET, "ssl.key.password": "kp", "sasl.username": "alice"}
    text = f"failed: password={SECRET} key kp for alice ({SECRET})"
    out = kafkaconf.redact(text, conf)
    assert SECRET not in out and "kp" not in out and "alice" in out
    assert out.count(kafkaconf.MASK) == 3


def test_use_reads_the_environment_and_every_client_gets_the_settings(tmp_path, monkeypatch):
    from gates.broker import client_conf

    f = tmp_path / "c.properties"
    f.write_text(GOOD)
    monkeypatch.setenv(kafkaconf.ENV, str(f))
    kafkaconf.use()
    conf = client_conf("h:1", **{"group.id": "g"})
    assert conf["sasl.password"] == SECRET and conf["group.id"] == "g"
    assert conf["bootstrap.servers"] == "h:1"
    assert kafkaconf.cli_args() == ["--kafka-config", str(f.resolve())]
    kafkaconf.use(None)
    monkeypatch.delenv(kafkaconf.ENV)
    kafkaconf.use()
    assert "sasl.password" not in client_conf("h:1") and kafkaconf.cli_args() == []


def test_the_sink_producer_and_consumer_get_the_settings(tmp_path):
    from gates.sink import KafkaSink

    f = tmp_path / "c.properties"
    f.write_text(GOOD)
    kafkaconf.use(f)
    s = KafkaSink("h:1", "out", ["k"], "q", "exactly_once")
    conf = s._producer_conf()
    assert conf["sasl.username"] == "alice" and conf["sasl.password"] == SECRET
    assert conf["transactional.id"] == "theseus-q"  # Theseus's own settings stay


def test_source_options_carry_the_settings_to_the_executors_but_not_in_repr():
    from gates.source import SourceOptions

    opts = SourceOptions.parse({"bootstrap": "h:1", "topic": "t", "format": "string",
                                "kafka.sasl.password": SECRET,
                                "kafka.security.protocol": "SASL_PLAINTEXT",
                                "kafka.sasl.username": "alice"})
    assert opts.consumer_conf()["sasl.password"] == SECRET
    assert opts.admin_conf()["sasl.password"] == SECRET
    assert SECRET not in repr(opts) and SECRET not in str(opts)


def test_builder_passes_the_settings_as_source_options(tmp_path, monkeypatch):
    """The source builder hands the executors the settings as ``kafka.<name>`` options."""
    from compat.check import load_plan
    from migrate.build import source as build_source
    from migrate.build.core import BuildOptions

    f = tmp_path / "c.properties"
    f.write_text(GOOD)
    kafkaconf.use(f)
    plan_file = tmp_path / "p.json"
    plan_file.write_text(json.dumps({
        "format": "theseus.plan/1", "query": "q", "config": {"state_partitions": 2},
        "nodes": [
            {"id": "src", "step": "source", "version": 1, "topic": "in", "partitions": 1,
             "format": "json", "role": "stream", "schema": [{"name": "a", "type": "bigint"}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["src"], "topic": "o",
             "format": "json", "key_columns": [], "mode": "append",
             "delivery": "exactly_once"}]}))
    plan = load_plan(str(plan_file))
    seen = {}

    class Reader:
        def format(self, _):
            return self

        def options(self, **kw):
            seen.update(kw)
            return self

        def load(self):
            return self

    class FakeBuilder:
        spark = type("S", (), {"readStream": Reader(), "read": Reader()})()
        opts = BuildOptions(bootstrap="h:1")

        def watermarks_read(self):
            return False

    node = plan.nodes["src"]
    build_source._build(node, FakeBuilder(), [], plan.info["src"])
    assert seen["kafka.sasl.password"] == SECRET and seen["kafka.sasl.username"] == "alice"
    assert seen["bootstrap"] == "h:1"


def _cli(*args, env=None):
    from migrate.cli import main

    return CliRunner().invoke(main, list(args), env=env)


def test_cli_bad_config_file_is_one_error_exit_2(tmp_path):
    f = tmp_path / "c.properties"
    f.write_text(f"sasl.jaas.config=org.x required password=\"{SECRET}\";\n")
    r = _cli("stop", "q", "--state", str(tmp_path / "st"), "--kafka-config", str(f))
    assert r.exit_code == 2, r.output
    assert "sasl.jaas.config" in r.output and "sasl.username" in r.output
    assert SECRET not in r.output and "Traceback" not in r.output
    r = _cli("stop", "q", "--state", str(tmp_path / "st"), "--kafka-config",
             str(tmp_path / "missing.properties"))
    assert r.exit_code == 2 and "cannot read the Kafka client properties file" in r.output


def test_cli_takes_the_file_from_the_environment(tmp_path):
    f = tmp_path / "c.properties"
    f.write_text("no.such.property=1\n")
    r = _cli("stop", "q", "--state", str(tmp_path / "st"),
             env={kafkaconf.ENV: str(f)})
    assert r.exit_code == 2 and "no.such.property" in r.output


def test_cli_errors_are_redacted(tmp_path):
    """An error whose text happens to hold the password (a path, a broker message) is
    printed with the password masked."""
    f = tmp_path / "c.properties"
    f.write_text(GOOD)
    r = _cli("stop", SECRET, "--state", str(tmp_path / "st"), "--kafka-config", str(f))
    assert r.exit_code == 2
    assert "no query named" in r.output and SECRET not in r.output
    assert kafkaconf.MASK in r.output


@pytest.mark.parametrize("cmd", [["run", "p.json", "--bootstrap", "h:1"],
                                 ["check", "p.json", "--query", "q"],
                                 ["plan", "import", "job.py"],
                                 ["migrate", "start", "p.json", "--bootstrap", "h:1"],
                                 ["migrate", "resume", "q"], ["migrate", "abort", "q"],
                                 ["migrate", "status", "q"], ["stop", "q"]])
def test_every_command_that_creates_kafka_clients_takes_the_option(cmd):
    r = _cli(*cmd, "--help")
    assert r.exit_code == 0 and "--kafka-config" in r.output, cmd


def test_check_does_not_load_kafka_config_machinery(tmp_path):
    """``theseus check`` stays free of confluent_kafka even with the variable set."""
    plan = ROOT / "fixtures"
    pairs = sorted(p for p in plan.rglob("old.json"))
    assert pairs
    old = pairs[0]
    new = old.with_name("new.json")
    code = (f"import sys; sys.argv=['theseus','check',{str(old)!r},{str(new)!r}];\n"
            "try:\n  from migrate.cli import main; main()\n"
            "except SystemExit: pass\n"
            "print('LOADED', 'confluent_kafka' in sys.modules)")
    env = {**os.environ, kafkaconf.ENV: str(tmp_path / "absent.properties"),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert "LOADED False" in out.stdout, out.stdout + out.stderr


class _Fut:
    def __init__(self, value=None, exc=None):
        self.value, self.exc = value, exc

    def result(self, timeout=None):
        if self.exc is not None:
            raise self.exc
        return self.value


class _Admin:
    """describe_topics as a broker with an authorizer answers it."""

    def __init__(self, ops: dict):
        self.ops = ops  # topic -> list of operation names | None | "denied"

    def describe_topics(self, topics, include_authorized_operations=False, request_timeout=0):
        from types import SimpleNamespace

        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AclOperation

        assert include_authorized_operations
        out = {}
        for t in topics.topic_names:
            v = self.ops[t]
            if v == "denied":
                out[t] = _Fut(exc=KafkaException(KafkaError(
                    KafkaError.TOPIC_AUTHORIZATION_FAILED)))
            elif v == "missing":
                out[t] = _Fut(exc=KafkaException(KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART)))
            else:
                ops = None if v is None else [getattr(AclOperation, o) for o in v]
                out[t] = _Fut(SimpleNamespace(authorized_operations=ops))
        return out


def test_check_access_names_topic_operation_and_user(tmp_path):
    from compat.errors import BrokerError
    from gates.broker import check_access

    f = tmp_path / "c.properties"
    f.write_text(GOOD)
    kafkaconf.use(f)
    admin = _Admin({"in": ["READ", "DESCRIBE"], "out": ["READ", "DESCRIBE"]})
    check_access("h:1", [("in", "READ", "reads")], client=admin)
    with pytest.raises(BrokerError) as e:
        check_access("h:1", [("in", "READ", "source 'a' reads"),
                             ("out", "WRITE", "sink 'o' writes the output to")], client=admin)
    text = e.value.render()
    assert "topic 'out'" in text and "no WRITE permission" in text and "alice" in text
    assert "--operation Write --topic out" in text and SECRET not in text
    # ALL implies WRITE; an unauthorized DESCRIBE means no access at all
    check_access("h:1", [("out", "WRITE", "x")], client=_Admin({"out": ["ALL"]}))
    with pytest.raises(BrokerError, match="no READ permission"):
        check_access("h:1", [("in", "READ", "x")], client=_Admin({"in": "denied"}))
    # no authorizer: the broker returns no operations, nothing is refused
    check_access("h:1", [("in", "WRITE", "x")], client=_Admin({"in": None}))
    # a topic not created yet (an output the first write creates) is not refused
    check_access("h:1", [("out", "WRITE", "x")], client=_Admin({"out": "missing"}))


def test_plan_access_lists_every_source_read_and_the_sink_write():
    from compat.check import load_plan
    from migrate.run import plan_access

    needs = plan_access(load_plan(str(ROOT / "fixtures" / "plans" / "ship_load.json")),
                        shadow_topic="side")
    ops = {(t, op) for t, op, _ in needs}
    assert ops == {("packages", "READ"), ("ships", "READ"), ("ship_alerts", "WRITE"),
                   ("side", "WRITE")}


def test_spark_conf_from_the_environment_is_checked(monkeypatch):
    """THESEUS_SPARK_CONF entries must be spark.<name>=<value>: anything else is one error
    before a JVM starts."""
    import migrate.run as run

    monkeypatch.setenv("THESEUS_SPARK_CONF", "spark.cores.max=1;oops")
    monkeypatch.setattr(run, "_SESSION", None)
    from compat.errors import RuntimeFailure

    with pytest.raises(RuntimeFailure, match="THESEUS_SPARK_CONF"):
        run.spark_session("spark://127.0.0.1:1")


def test_the_kafka_store_takes_several_brokers():
    """A store on a three-broker cluster names them all: it opens while one is down."""
    from compat.errors import RuntimeFailure
    from migrate.kafkastore import local_dir, parse_spec

    assert parse_spec("kafka://h1:9092,h2:9093/st") == ("h1:9092,h2:9093", "st")
    assert parse_spec("kafka://h1:9092/st") == ("h1:9092", "st")
    assert local_dir("kafka://h1:1,h2:2/st").name == "kafka-h1_1+h2_2-st"
    for bad in ("kafka://h1:9092,/st", "kafka://h1/st", "kafka://h1:1,h2/st"):
        with pytest.raises(RuntimeFailure, match="malformed Kafka store address"):
            parse_spec(bad)


def test_check_query_reads_a_kafka_store_with_the_settings(tmp_path, monkeypatch):
    """``check --query NAME --state kafka://...``: the store's clients get --kafka-config
    (a secured broker answers nothing else); a plan-only check never reads the file."""
    from compat.checkpoint import CheckpointError
    from migrate import ckcheck

    cfg = tmp_path / "client.properties"
    cfg.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                   f"sasl.username=alice\nsasl.password={SECRET}\n")
    seen = {}

    def fake_check(checkpoint, path, **kw):
        seen["conf"] = kafkaconf.active()
        raise CheckpointError("stop here", expected="-", found="-")

    monkeypatch.setattr(ckcheck, "check_checkpoint", fake_check)
    kafkaconf.use(None)
    r = _cli("check", "--query", "q", "--state", "kafka://h:1/theseus", "--kafka-config",
             str(cfg), str(ROOT / "fixtures/upgrades/transparent_stream_source_version_bump"
                                  / "new.json"))
    assert r.exit_code == 2 and SECRET not in r.output, r.output
    assert seen["conf"].get("sasl.username") == "alice"
    kafkaconf.use(None)
    # a plan-only check with a missing file named in the environment still checks
    old = ROOT / "fixtures/upgrades/transparent_stream_source_version_bump/old.json"
    r = _cli("check", str(old), str(old),
             env={kafkaconf.ENV: str(tmp_path / "absent.properties")})
    assert r.exit_code == 0, r.output


def test_plan_import_asks_the_broker_with_the_settings(tmp_path, monkeypatch):
    import confluent_kafka.admin as admin_mod

    from migrate import adopt

    got = {}

    class Admin:
        def __init__(self, conf):
            got.update(conf)
            raise RuntimeError("no broker here")

    monkeypatch.setattr(admin_mod, "AdminClient", Admin)
    cfg = tmp_path / "client.properties"
    cfg.write_text(f"sasl.username=alice\nsasl.password={SECRET}\n"
                   "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n")
    kafkaconf.use(str(cfg))
    try:
        assert adopt.topic_partitions("h:1", "t") is None
    finally:
        kafkaconf.use(None)
    assert got["sasl.username"] == "alice" and got["bootstrap.servers"] == "h:1"
