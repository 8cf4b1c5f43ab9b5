"""The Schema Registry client kdiv uses: confluent-kafka's, with errors sorted by what to do.

Works with any registry speaking Confluent's REST API (Confluent Schema Registry,
Karapace, Apicurio's /apis/ccompat/v7, kdiv's development registry). Failures come out
as one of three errors, because callers act differently on each:

- `SchemaNotFound`: the registry answered that the id (or subject) does not exist;
- `RegistryRejected`: it refused a request (4xx other than not-found: incompatible, invalid);
- `RegistryUnavailable`: no usable answer (connection, timeout, 5xx, a body that is not
  the JSON the API promises). Callers degrade; they never take it as a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

try:  # the HTTP library confluent-kafka's client uses (httpx2, httpx before it)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[import-not-found,no-redef]
from confluent_kafka.schema_registry import (
    AsyncSchemaRegistryClient,
    MessageField,
    Schema,
    SchemaRegistryError,
    SerializationContext,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)

from kdiv.config.redact import redacted, split_userinfo
from kdiv.config.settings import RegistrySettings
from kdiv.untrusted import preview

STRATEGIES = {
    "topic": topic_subject_name_strategy,
    "record": record_subject_name_strategy,
    "topic_record": topic_record_subject_name_strategy,
}


class RegistryError(Exception):
    pass


class SchemaNotFound(RegistryError):
    pass


class RegistryRejected(RegistryError):
    pass


class RegistryUnavailable(RegistryError):
    pass


def expected_subject(strategy: str, topic: str, *, is_key: bool, record_name: str | None) -> str | None:
    """The subject a Confluent (de)serializer with `strategy` uses; None when the strategy
    needs a record name and the schema has none (e.g. a primitive or a union)."""
    if strategy != "topic" and not record_name:
        return None
    context = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
    return STRATEGIES[strategy](context, record_name)


def client_config(settings: RegistrySettings) -> dict:
    """confluent-kafka's client configuration for these settings."""
    # Settings read from the environment carry no user info in the URL (`RegistrySettings`);
    # one made otherwise has it moved here too, so no request URL the client logs holds it.
    urls = [split_userinfo(u) for u in settings.url.split(",")]
    in_url = next((userinfo for _, userinfo in urls if userinfo is not None), None)
    config: dict = {
        "url": ",".join(u for u, _ in urls),
        "timeout": settings.timeout_s,
        # kdiv retries on its own schedule (and must not stall the worker meanwhile).
        "max.retries": 0,
    }
    if settings.basic_auth or in_url:
        config["basic.auth.user.info"] = settings.basic_auth or in_url
    if settings.ca:
        config["ssl.ca.location"] = str(settings.ca)
    if settings.cert:
        config["ssl.certificate.location"] = str(settings.cert)
        config["ssl.key.location"] = str(settings.key)
    return config


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int


class SchemaRegistry:
    def __init__(self, settings: RegistrySettings) -> None:
        self.url = redacted(settings.url)  # as errors and /health show it
        self.configured = settings.configured
        # Without a registry every call raises RegistryUnavailable: schema checks say UNCHECKED.
        self._client = AsyncSchemaRegistryClient(client_config(settings)) if settings.configured else None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    @property
    def client(self) -> AsyncSchemaRegistryClient:
        if self._client is None:
            raise RegistryUnavailable("no schema registry (KDIV_SCHEMA_REGISTRY_URL=none)")
        return self._client

    async def register(self, subject: str, schema_text: str) -> int:
        return await self._call(
            f"register a schema under {subject}", self.client.register_schema(subject, Schema(schema_text, "AVRO"))
        )

    async def schema_text(self, schema_id: int) -> str:
        schema = await self._call(f"read schema id {schema_id}", self.client.get_schema(schema_id))
        if not isinstance(getattr(schema, "schema_str", None), str):
            raise RegistryUnavailable(f"{self.url}: schema id {schema_id} came back without its schema text")
        return schema.schema_str

    async def versions_of(self, schema_id: int) -> list[SubjectVersion]:
        """Every (subject, version) the id is registered under (`GET /schemas/ids/{id}/versions`)."""
        found = await self._call(
            f"read the subjects of schema id {schema_id}", self.client.get_schema_versions(schema_id)
        )
        pairs = [(getattr(item, "subject", None), getattr(item, "version", None)) for item in found or ()]
        if not all(isinstance(subject, str) and isinstance(version, int) for subject, version in pairs):
            raise RegistryUnavailable(
                f"{self.url}: subjects of schema id {schema_id}: malformed answer {preview(pairs)}"
            )
        return [SubjectVersion(cast(str, subject), cast(int, version)) for subject, version in pairs]

    async def register_id_under(self, schema_id: int, subject: str) -> int:
        """Register the schema of `schema_id` under `subject` (the subject-mismatch repair);
        the id the registry answers, the same one where ids are global."""
        return await self.register(subject, await self.schema_text(schema_id))

    async def subjects(self) -> list[str]:
        return await self._call("list subjects", self.client.get_subjects())

    async def _call(self, what: str, request):
        try:
            answer = await request
        except SchemaRegistryError as error:
            status, code = error.http_status_code, error.error_code
            message = f"{self.url}: cannot {what}: HTTP {status}, error {code}: {error.error_message}"
            if status == 404 and code in (40401, 40402, 40403):
                raise SchemaNotFound(message) from None
            if 400 <= status < 500 and code != -1 and status not in (408, 429):
                raise RegistryRejected(message) from None
            raise RegistryUnavailable(message) from None
        except (httpx.HTTPError, OSError) as error:
            raise RegistryUnavailable(f"{self.url}: cannot {what}: {type(error).__name__}: {error}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            # A 2xx whose body is not the JSON the API defines (json errors are ValueErrors).
            raise RegistryUnavailable(f"{self.url}: cannot {what}: malformed answer: {preview(error)}") from None
        return answer
