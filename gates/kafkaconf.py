"""Kafka client settings for every client Theseus creates (``--kafka-config FILE``).

The file is a client properties file, as Kafka's own tools take with ``--command-config``,
but with librdkafka's property names (Theseus's clients are librdkafka's)::

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=alice
    sasl.password=alice-secret
    ssl.ca.location=/etc/kafka/ca.pem

``theseus run``, ``migrate`` and ``stop`` take it with ``--kafka-config FILE`` or
``$THESEUS_KAFKA_CONFIG``; :func:`use` makes it the process's settings, and every client
(the store's mirror, control events, the migrator's admin and watermark clients, the gated
sink's producer and consumer) merges :func:`active` through
:func:`gates.broker.client_conf`.  The gated source runs partly on Spark's executors, which
share nothing with the driver but what Spark ships: the builder passes the settings as the
source's ``kafka.<name>`` options (Spark redacts option values whose name matches
``spark.redaction.regex``), so no executor reads the file, its path or an environment
variable.

Settings named ``schema.registry.*`` are the schema registry client's
(:mod:`compat.registry`: ``schema.registry.url``, ``schema.registry.basic.auth.user.info``),
kept apart from librdkafka's (:func:`registry_settings`) and redacted like them.

Java names that librdkafka does not know are refused with the name to use instead
(:data:`JAVA_NAMES`); names Theseus sets itself (``bootstrap.servers``: use ``--bootstrap``;
group and transactional ids) are refused too.  Secrets (:func:`is_secret`) are never printed:
:func:`redact` replaces their values in any text, and the CLI passes every error line through
it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from compat.errors import TheseusError

ENV = "THESEUS_KAFKA_CONFIG"
MASK = "[redacted]"

#: Java client names -> what to write instead (librdkafka)
JAVA_NAMES = {
    "sasl.jaas.config": "sasl.username and sasl.password (SCRAM/PLAIN), or "
                        "sasl.oauthbearer.* for OAUTHBEARER",
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates)",
    "ssl.truststore.password": "nothing (a PEM CA file has no password)",
    "ssl.truststore.type": "nothing (ssl.ca.location takes PEM)",
    "ssl.keystore.type": "nothing (ssl.keystore.location takes PKCS#12)",
    "sasl.login.callback.handler.class": "sasl.oauthbearer.method=oidc and "
                                         "sasl.oauthbearer.* settings",
    "sasl.client.callback.handler.class": "nothing (librdkafka has no Java callbacks)",
}
#: set by Theseus per client: a file may not change them
RESERVED = ("bootstrap.servers", "metadata.broker.list", "group.id", "transactional.id",
            "enable.idempotence", "isolation.level", "enable.auto.commit", "client.id")
_SECRET = re.compile(r"password|secret|token|credential|(^|\.)key(\.pem)?$|jaas|"
                     r"oauthbearer\.config|user\.info", re.I)
#: the schema registry client's settings share the file under this prefix
REGISTRY_PREFIX = "schema.registry."

# librdkafka logs every failed connection attempt (every 50 ms for a broker that is down):
# the clients of a migration report a failure once, as an error naming what failed.
QUIET = logging.getLogger("theseus.kafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False

_ACTIVE: dict[str, str] = {}
_REGISTRY: dict[str, str] = {}
_PATH: str | None = None


class KafkaConfigError(TheseusError):
    """The Kafka client properties file is unreadable or names a setting it cannot."""


def is_secret(name: str) -> bool:
    """True for settings whose value must never be shown (``sasl.password``,
    ``ssl.key.password``, ``ssl.key.pem``, ``sasl.oauthbearer.client.secret``...)."""
    return bool(_SECRET.search(name))


def parse(text: str, file: str = "<kafka config>") -> dict[str, str]:
    """``name=value`` lines (also ``name: value``), ``#``/``!`` comments, a trailing
    backslash continues a line: the subset of Java's properties format client files use."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + lines[i].strip()
            i += 1
        if not line or line[0] in "#!":
            continue
        m = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if not m:
            raise KafkaConfigError(f"line {lineno} is not 'name=value'", file=file,
                                   expected="name=value", found=_show(line))
        name, value = m.group(1).strip(), m.group(2).strip()
        if name in JAVA_NAMES:
            raise KafkaConfigError(f"line {lineno}: '{name}' is a Java client setting",
                                   file=file, expected="librdkafka's property names",
                                   found=name, hint=f"write {JAVA_NAMES[name]}")
        if name in RESERVED:
            raise KafkaConfigError(f"line {lineno}: '{name}' is set by Theseus", file=file,
                                   expected="security and client settings only", found=name,
                                   hint="give the brokers with --bootstrap"
                                   if "broker" in name or "bootstrap" in name else None)
        out[name] = value
    return out


def _show(line: str) -> str:
    name = re.split(r"[=:\s]", line, maxsplit=1)[0]
    return repr(f"{name}=..." if is_secret(name) else line[:60])


def load(path: str | os.PathLike[str]) -> dict[str, str]:
    """The settings in the file at ``path``, checked against librdkafka: an unknown name or
    a bad value is one :class:`KafkaConfigError` naming the file (never the value of a
    secret)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise KafkaConfigError("cannot read the Kafka client properties file", file=file,
                               expected="a readable file",
                               found=e.strerror or type(e).__name__) from None
    except UnicodeDecodeError:
        raise KafkaConfigError("the Kafka client properties file is not UTF-8 text",
                               file=file) from None
    conf = parse(text, file)
    validate({k: v for k, v in conf.items() if not k.startswith(REGISTRY_PREFIX)}, file)
    return conf


def validate(conf: Mapping[str, str], file: str = "<kafka config>") -> None:
    """Let librdkafka judge every name and value (it knows its own, e.g. whether this build
    has SASL/SCRAM and SSL), without connecting anywhere."""
    if not conf:
        return
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({**conf, "logger": QUIET})
    except KafkaException as e:
        err = e.args[0] if e.args else e
        msg = str(err.str() if hasattr(err, "str") else err)
        raise KafkaConfigError(f"librdkafka refuses a setting: {redact(msg, conf)}",
                               file=file) from None
    except (TypeError, ValueError) as e:
        raise KafkaConfigError(f"librdkafka refuses a setting: {redact(str(e), conf)}",
                               file=file) from None


def use(path: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Load ``path`` (default: ``$THESEUS_KAFKA_CONFIG``, none when unset) and make it the
    settings of every client this process creates; returns them."""
    global _ACTIVE, _PATH, _REGISTRY
    if path is None:
        path = os.environ.get(ENV) or None
    if path is None:
        _ACTIVE, _REGISTRY, _PATH = {}, {}, None
        return {}
    conf = load(path)
    _REGISTRY = {k: v for k, v in conf.items() if k.startswith(REGISTRY_PREFIX)}
    conf = {k: v for k, v in conf.items() if not k.startswith(REGISTRY_PREFIX)}
    _ACTIVE, _PATH = conf, str(Path(path).resolve())
    return dict(conf)


def active() -> dict[str, str]:
    """The settings :func:`use` loaded (a copy), ``{}`` when none."""
    return dict(_ACTIVE)


def registry_settings() -> dict[str, str]:
    """The ``schema.registry.*`` settings :func:`use` loaded (a copy), ``{}`` when none."""
    return dict(_REGISTRY)


def cli_args() -> list[str]:
    """``--kafka-config PATH`` for a child ``theseus`` process, or nothing."""
    return ["--kafka-config", _PATH] if _PATH else []


def secrets(conf: Mapping[str, str] | None = None) -> list[str]:
    """The secret values of ``conf`` (default: the active settings)."""
    conf = {**_ACTIVE, **_REGISTRY} if conf is None else conf
    return [v for k, v in conf.items() if is_secret(k) and v]


def redact(text: str, conf: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret value of ``conf`` (default: the active settings) replaced
    by ``[redacted]``; longest first, so one secret inside another leaves no part."""
    if not text:
        return text
    for s in sorted(secrets(conf), key=len, reverse=True):
        text = text.replace(s, MASK)
    return text


def user(conf: Mapping[str, str] | None = None) -> str | None:
    """The principal the settings authenticate as, when they say (SASL username)."""
    conf = _ACTIVE if conf is None else conf
    return conf.get("sasl.username")
