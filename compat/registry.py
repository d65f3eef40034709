"""A client of a schema registry's Confluent-compatible REST API (Confluent Schema Registry,
Apicurio's ``/apis/ccompat/v7``, Karapace...), on the standard library alone: the gate asks
it whether a subject accepts a schema, the gated source fetches writer schemas by id.

The URL is the API's root (``http://127.0.0.1:18081/apis/ccompat/v7``): ``SCHEMA_REGISTRY_URL``
or ``schema.registry.url`` in the ``--kafka-config`` file, whose ``schema.registry.*``
settings are this client's (``schema.registry.basic.auth.user.info=user:password``).

Errors are :class:`RegistryError`: ``status`` is the HTTP status (None: no answer), the
message names the URL and what the registry said.  Schemas fetched by id are cached: an id
names one schema for ever.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compat.errors import RuntimeFailure

ENV = "SCHEMA_REGISTRY_URL"
PREFIX = "schema.registry."
_CONTENT = "application/vnd.schemaregistry.v1+json"


class RegistryError(RuntimeFailure):
    """The registry refused a request or did not answer (``status`` None)."""

    def __init__(self, message: str, *, status: int | None = None, code: int | None = None,
                 **kw: object) -> None:
        self.status = status
        self.code = code
        super().__init__(message, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Verdict:
    """The registry's answer on a schema for a subject: ``compatible`` (None: the subject
    has no version yet, so anything is accepted), its ``level`` and its reasons."""

    subject: str
    compatible: bool | None
    level: str | None
    reasons: tuple[str, ...] = ()


@dataclass
class RegistryClient:
    url: str
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 10.0
    _by_id: dict[int, str] = field(default_factory=dict, repr=False)

    @classmethod
    def configured(cls, url: str | None = None, settings: Mapping[str, str] | None = None
                   ) -> RegistryClient | None:
        """The client for ``url``, else ``schema.registry.url`` of ``settings``, else
        ``$SCHEMA_REGISTRY_URL``; None when none names a registry."""
        conf = {k[len(PREFIX):]: v for k, v in (settings or {}).items()
                if k.startswith(PREFIX)}
        url = url or conf.get("url") or os.environ.get(ENV)
        return cls(url.rstrip("/"), conf) if url else None

    # -- requests
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Accept": _CONTENT, "Content-Type": _CONTENT})
        info = self.settings.get("basic.auth.user.info")
        if info:
            req.add_header("Authorization",
                           "Basic " + base64.b64encode(info.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                doc = json.loads(e.read() or b"{}")
            except ValueError:
                doc = {}
            code = doc.get("error_code") if isinstance(doc, dict) else None
            said = doc.get("message") if isinstance(doc, dict) else None
            raise RegistryError(f"the schema registry at {self.url} refused {method} {path}",
                                status=e.code, code=code, expected="a 2xx answer",
                                found=f"HTTP {e.code}" + (f": {said}" if said else "")
                                ) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryError(f"the schema registry at {self.url} does not answer",
                                expected="a registry's Confluent-compatible API",
                                found=str(reason)) from None

    @staticmethod
    def _quote(subject: str) -> str:
        return urllib.parse.quote(subject, safe="")

    # -- the API
    def schema(self, schema_id: int) -> str:
        """The schema text registered under ``schema_id`` (cached)."""
        text = self._by_id.get(schema_id)
        if text is None:
            doc = self._request("GET", f"/schemas/ids/{schema_id}")
            text = doc["schema"]
            self._by_id[schema_id] = text
        return text

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (the registry checks the subject's level);
        its id (the same schema gets the same id)."""
        doc = self._request("POST", f"/subjects/{self._quote(subject)}/versions",
                            {"schema": schema, "schemaType": "AVRO"})
        sid = int(doc["id"])
        self._by_id.setdefault(sid, schema)
        return sid

    def level(self, subject: str) -> str | None:
        """The compatibility level in force for ``subject`` (its own, else the global)."""
        for path in (f"/config/{self._quote(subject)}", "/config"):
            try:
                doc = self._request("GET", path)
            except RegistryError as e:
                if e.status == 404:
                    continue
                raise
            return doc.get("compatibilityLevel") or doc.get("compatibility")
        return None

    def check(self, subject: str, schema: str) -> Verdict:
        """Whether ``subject`` accepts ``schema`` at its own level (the registry's
        compatibility endpoint against its versions)."""
        try:
            doc = self._request(
                "POST", f"/compatibility/subjects/{self._quote(subject)}/versions/latest"
                "?verbose=true", {"schema": schema, "schemaType": "AVRO"})
        except RegistryError as e:
            if e.status == 404 and e.code in (40401, 40402):
                return Verdict(subject, None, self.level(subject))
            raise
        reasons = doc.get("messages") or ([doc["reason"]] if doc.get("reason") else [])
        return Verdict(subject, bool(doc.get("is_compatible")), self.level(subject),
                       tuple(str(r) for r in reasons))
