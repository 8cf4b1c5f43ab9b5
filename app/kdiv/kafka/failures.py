"""A failure as one line for an operator."""

from __future__ import annotations

import gc
import logging
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

from kdiv.config.redact import redacted

# aiokafka logs why each bootstrap server could not be reached here, then raises a bare
# "Unable to bootstrap from [...]".
_CONNECT_LOGGER = "aiokafka"
_CONNECT_MESSAGE = "Unable connect to"


class BrokerRefused(KafkaConnectionError):
    """No broker could be reached, and the message says why (authentication, TLS, network).
    `by_policy`: the broker answered and refused the client (credentials, certificates), which
    no retry mends, unlike a broker that is away."""

    by_policy: bool = False


def refused_by_policy(reason: BaseException) -> bool:
    """True when a connection failed because the broker refused the client's credentials or
    certificates (SASL, TLS), not because it was away."""
    tls = reason if isinstance(reason, ssl.SSLError) else reason.__cause__
    return isinstance(reason, SaslAuthenticationFailed) or isinstance(tls, ssl.SSLError)


def failure_text(failure: BaseException) -> str:
    """ "Type: message", without the type twice (aiokafka's messages start with it)."""
    if isinstance(failure, BrokerRefused):
        return str(failure.args[0])  # its own words; KafkaError's str prefixes the type
    name = type(failure).__name__
    text = str(failure) or name
    return text if text.startswith(name) else f"{name}: {text}"


def refusal_text(reason: BaseException) -> str:
    """Why a connection to a broker failed, in words that name the setting to look at."""
    if isinstance(reason, SaslAuthenticationFailed):
        said = reason.args[0] if reason.args and isinstance(reason.args[0], str) else reason.description
        return f"SASL authentication failed (KDIV_SASL_USERNAME, KDIV_SASL_PASSWORD, KDIV_SASL_MECHANISM): {said}"
    tls = reason if isinstance(reason, ssl.SSLError) else reason.__cause__
    if isinstance(tls, ssl.SSLCertVerificationError):
        return f"the broker's TLS certificate was not accepted (KDIV_SSL_CA, KDIV_SSL_CHECK_HOSTNAME): {tls.verify_message}"
    if isinstance(tls, ssl.SSLError):
        alert = (tls.reason or str(tls)).lower().replace("_", " ")
        if "certificate" in alert:
            # The broker's alert after the handshake: no client certificate, or one it does not trust.
            return (
                "the broker did not accept a TLS client certificate (KDIV_SSL_CERT and KDIV_SSL_KEY must name "
                f"one signed by a CA it trusts): {alert}"
            )
        return f"TLS failed: {alert}"
    return failure_text(reason)


class _ConnectReasons(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[BaseException] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncio":
            # A request future aiokafka abandoned when the broker closed the connection is
            # reported when collected: the same refusal again, as a traceback.
            failure = record.exc_info[1] if record.exc_info else None
            return not (isinstance(failure, KafkaConnectionError) and self.reasons)
        args = record.args if isinstance(record.args, tuple) else ()
        reasons = [arg for arg in args if isinstance(arg, BaseException)]
        if reasons and str(record.msg).startswith(_CONNECT_MESSAGE):
            self.reasons.append(reasons[-1])
            return False  # said once, in the error raised
        return True


@contextmanager
def refusals_explained(bootstrap: str | None = None) -> Iterator[None]:
    """Within: a client that reaches no bootstrap server raises BrokerRefused naming the
    reason of the last one (after "Kafka at `bootstrap`: " when given), instead of aiokafka's
    bare "Unable to bootstrap" after one log line per server. Those log lines are not written
    (their reasons are in the error)."""
    loggers = [logging.getLogger(_CONNECT_LOGGER), logging.getLogger("asyncio")]
    reasons = _ConnectReasons()
    for logger in loggers:
        # First among the logger's filters: one that drops repeated lines must not hide a reason.
        logger.filters.insert(0, reasons)
    try:
        yield
    except KafkaConnectionError as failed:
        if isinstance(failed, BrokerRefused) or not reasons.reasons:
            raise
        # Collected now, while the filter holds: see _ConnectReasons.
        gc.collect()
        where = f"Kafka at {redacted(bootstrap)}: " if bootstrap else ""
        refused = BrokerRefused(where + refusal_text(reasons.reasons[-1]))
        refused.by_policy = refused_by_policy(reasons.reasons[-1])
        raise refused from failed
    finally:
        for logger in loggers:
            logger.removeFilter(reasons)
