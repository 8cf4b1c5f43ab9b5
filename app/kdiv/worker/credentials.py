"""kdiv's Kafka security settings as Faust's ``broker_credentials``."""

from __future__ import annotations

from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from kdiv.config.security import KafkaSecurity


def faust_credentials(security: KafkaSecurity) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for these settings (None: plaintext)."""
    if security.uses_sasl:
        return SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password,
            mechanism=security.sasl_mechanism,
            ssl_context=security.ssl_context(),
        )
    if security.uses_ssl:
        return SSLCredentials(security.ssl_context())
    return None
