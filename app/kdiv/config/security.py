"""How kdiv's Kafka clients authenticate and encrypt: one set of ``KDIV_*`` settings for all.

The Faust worker, its own aiokafka clients, the ``kdiv`` commands and librdkafka-based
readers (confluent-kafka, the reconcile job) all take their security settings from here,
so a cluster that needs TLS or SASL is configured once:

- ``KDIV_SECURITY_PROTOCOL``: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``
- ``KDIV_SASL_MECHANISM``: ``PLAIN`` (default), ``SCRAM-SHA-256``, ``SCRAM-SHA-512``
- ``KDIV_SASL_USERNAME``, ``KDIV_SASL_PASSWORD``
- ``KDIV_SSL_CA``: PEM file of the CA(s) that signed the brokers' certificates (default: the
  system's trust store)
- ``KDIV_SSL_CERT``, ``KDIV_SSL_KEY``, ``KDIV_SSL_KEY_PASSWORD``: a client certificate (mutual TLS)
- ``KDIV_SSL_CHECK_HOSTNAME``: ``true`` (default); ``false`` still verifies the chain

A setting that the protocol would ignore is an error, not a silent no-op: a password set
for a PLAINTEXT cluster means the operator expects it to be used.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.helpers import create_ssl_context

from kdiv.config.env import PREFIX, EnvReader, SettingsError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

_SASL_VARIABLES = ("SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD")
_SSL_VARIABLES = ("SSL_CA", "SSL_CERT", "SSL_KEY", "SSL_KEY_PASSWORD", "SSL_CHECK_HOSTNAME")


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_ca: Path | None = None
    ssl_cert: Path | None = None
    ssl_key: Path | None = None
    ssl_key_password: str = field(default="", repr=False)
    ssl_check_hostname: bool = True

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KafkaSecurity:
        env = EnvReader(environ)
        protocol = env.choice("SECURITY_PROTOCOL", PROTOCOLS, cls.protocol)
        given = {name for name in (*_SASL_VARIABLES, *_SSL_VARIABLES) if env.str(name, "")}
        uses_sasl, uses_ssl = protocol.startswith("SASL_"), protocol.endswith("SSL")
        for names, used in ((_SASL_VARIABLES, uses_sasl), (_SSL_VARIABLES, uses_ssl)):
            stray = [PREFIX + name for name in names if name in given and not used]
            if stray:
                raise SettingsError(
                    f"{', '.join(stray)} set, but {PREFIX}SECURITY_PROTOCOL={protocol} does not use "
                    f"{'SASL' if names is _SASL_VARIABLES else 'TLS'}: set the protocol or unset them"
                )
        security = cls(
            protocol=protocol,
            sasl_mechanism=env.choice("SASL_MECHANISM", MECHANISMS, cls.sasl_mechanism),
            sasl_username=env.str("SASL_USERNAME", ""),
            sasl_password=env.str("SASL_PASSWORD", ""),
            ssl_ca=env.file("SSL_CA"),
            ssl_cert=env.file("SSL_CERT"),
            ssl_key=env.file("SSL_KEY"),
            ssl_key_password=env.str("SSL_KEY_PASSWORD", ""),
            ssl_check_hostname=env.bool("SSL_CHECK_HOSTNAME", cls.ssl_check_hostname),
        )
        if uses_sasl and not (security.sasl_username and security.sasl_password):
            raise SettingsError(
                f"{PREFIX}SECURITY_PROTOCOL={protocol} needs {PREFIX}SASL_USERNAME and {PREFIX}SASL_PASSWORD"
            )
        if (security.ssl_cert is None) != (security.ssl_key is None):
            have, missing = ("SSL_CERT", "SSL_KEY") if security.ssl_cert else ("SSL_KEY", "SSL_CERT")
            raise SettingsError(f"{PREFIX}{have} is set without {PREFIX}{missing}: a client certificate needs both")
        if security.ssl_key_password and security.ssl_key is None:
            raise SettingsError(f"{PREFIX}SSL_KEY_PASSWORD is set without {PREFIX}SSL_KEY")
        # Load the files now: a bad CA, certificate or key stops the start with its name,
        # not the first connection with an OpenSSL message.
        security.ssl_context()
        return security

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context (None for PLAINTEXT and SASL_PLAINTEXT)."""
        if not self.uses_ssl:
            return None
        try:
            context = create_ssl_context(
                cafile=self.ssl_ca,
                certfile=self.ssl_cert,
                keyfile=self.ssl_key,
                password=self.ssl_key_password or None,
            )
        except (ssl.SSLError, OSError) as bad:
            files = ", ".join(
                f"{PREFIX}{name}={path}"
                for name, path in (("SSL_CA", self.ssl_ca), ("SSL_CERT", self.ssl_cert), ("SSL_KEY", self.ssl_key))
                if path is not None
            )
            raise SettingsError(f"cannot load the TLS files ({files or 'system trust store'}): {bad}") from None
        # The chain is still verified (CERT_REQUIRED); only the name match is skipped.
        context.check_hostname = self.ssl_check_hostname
        return context

    def aiokafka_kwargs(self) -> dict:
        """Keyword arguments for any aiokafka client (consumer, producer, admin, AIOKafkaClient)."""
        kwargs: dict = {"security_protocol": self.protocol}
        if self.uses_ssl:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return kwargs

    def librdkafka_config(self) -> dict[str, str]:
        """The same settings as librdkafka (confluent-kafka) configuration properties."""
        config = {"security.protocol": self.protocol}
        if self.uses_sasl:
            config.update(
                {
                    "sasl.mechanism": self.sasl_mechanism,
                    "sasl.username": self.sasl_username,
                    "sasl.password": self.sasl_password,
                }
            )
        if self.uses_ssl:
            config["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
            for key, path in (
                ("ssl.ca.location", self.ssl_ca),
                ("ssl.certificate.location", self.ssl_cert),
                ("ssl.key.location", self.ssl_key),
            ):
                if path is not None:
                    config[key] = str(path)
            if self.ssl_key_password:
                config["ssl.key.password"] = self.ssl_key_password
        return config


PLAINTEXT = KafkaSecurity()
