"""TLS and SASL settings: parsed once from KDIV_*, handed to every Kafka client kdiv builds.

The embedded broker speaks only PLAINTEXT, so no Kafka handshake over TLS or SASL happens
here; what is checked is the configuration each real client object ends up with, that
librdkafka accepts (and loads) what kdiv derives for it, and a real TLS handshake of the
context kdiv builds against a local TLS server.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import confluent_kafka
import pytest
import trustme
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from faust.auth import SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from kdiv.cli import main as kdiv
from kdiv.config.security import KafkaSecurity
from kdiv.config.settings import Settings, SettingsError
from kdiv.dev import demo
from kdiv.kafka import consume, discovery, produce, tansu
from kdiv.kafka.discovery import ClusterView, WatchedTopic
from kdiv.worker.credentials import faust_credentials
from kdiv.worker.service import build_app
from kdiv.worker.web.incidents_reader import incidents_consumer
from kdiv.writer.confluent import producer_settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a broker certificate for "localhost", a client certificate and its key (also
    encrypted), and a second CA that signed nothing here."""
    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("kdiv-worker@example.com")
    paths = {name: d / f"{name}.pem" for name in ("ca", "other_ca", "client_cert", "client_key", "client_key_enc")}
    ca.cert_pem.write_to_path(paths["ca"])
    other_ca.cert_pem.write_to_path(paths["other_ca"])
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), password=None)
    paths["client_key_enc"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret-key-pass"),
        )
    )
    paths["not_pem"] = d / "not.pem"
    paths["not_pem"].write_text("this is not a certificate\n")
    paths["_ca"], paths["_server"] = ca, server
    return paths


def env_of(**values: str | Path) -> dict[str, str]:
    return {f"KDIV_{name.upper()}": str(value) for name, value in values.items()}


# -- parsing -------------------------------------------------------------------------------


def test_plaintext_is_the_default_and_configures_nothing_else():
    security = Settings.from_env({"KDIV_TOPICS": "t"}).kafka_security
    assert security == KafkaSecurity()
    assert security.aiokafka_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(security) is None
    assert security.librdkafka_config() == {"security.protocol": "PLAINTEXT"}


def test_tls_with_ca_only(pki):
    security = KafkaSecurity.from_env(env_of(security_protocol="SSL", ssl_ca=pki["ca"]))
    kwargs = security.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SSL" and "sasl_mechanism" not in kwargs
    context = kwargs["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert security.librdkafka_config() == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki["ca"]),
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert isinstance(faust_credentials(security), SSLCredentials)


def test_mutual_tls_with_an_encrypted_key_and_no_hostname_check(pki):
    security = KafkaSecurity.from_env(
        env_of(
            security_protocol="SSL",
            ssl_ca=pki["ca"],
            ssl_cert=pki["client_cert"],
            ssl_key=pki["client_key_enc"],
            ssl_key_password="s3cret-key-pass",
            ssl_check_hostname="false",
        )
    )
    context = security.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    assert security.librdkafka_config() == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki["ca"]),
        "ssl.certificate.location": str(pki["client_cert"]),
        "ssl.key.location": str(pki["client_key_enc"]),
        "ssl.key.password": "s3cret-key-pass",
        "ssl.endpoint.identification.algorithm": "none",
    }
    # Secrets stay out of logs and tracebacks.
    assert "s3cret" not in repr(security)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_each_mechanism(mechanism):
    security = KafkaSecurity.from_env(
        env_of(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_username="kdiv",
            sasl_password="pw-123",
        )
    )
    assert security.aiokafka_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "kdiv",
        "sasl_plain_password": "pw-123",
    }
    credentials = faust_credentials(security)
    assert isinstance(credentials, SASLCredentials)
    assert (credentials.mechanism.value, credentials.protocol.value) == (mechanism, "SASL_PLAINTEXT")
    assert security.librdkafka_config() == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "kdiv",
        "sasl.password": "pw-123",
    }
    assert "pw-123" not in repr(security)


def test_sasl_over_tls(pki):
    security = KafkaSecurity.from_env(
        env_of(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="kdiv",
            sasl_password="pw",
            ssl_ca=pki["ca"],
        )
    )
    assert security.sasl_mechanism == "SCRAM-SHA-512"  # not the PLAIN default
    kwargs = security.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL" and isinstance(kwargs["ssl_context"], ssl.SSLContext)
    credentials = faust_credentials(security)
    assert credentials.protocol.value == "SASL_SSL" and credentials.ssl_context is not None
    assert security.librdkafka_config()["ssl.ca.location"] == str(pki["ca"])


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"security_protocol": "TLS"}, r"KDIV_SECURITY_PROTOCOL='TLS' is not one of"),
        ({"security_protocol": "SASL_PLAINTEXT"}, "KDIV_SASL_USERNAME and KDIV_SASL_PASSWORD"),
        ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "KDIV_SASL_USERNAME and KDIV_SASL_PASSWORD"),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "GSSAPI",
                "sasl_username": "u",
                "sasl_password": "p",
            },
            "KDIV_SASL_MECHANISM='GSSAPI' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
        ({"security_protocol": "SSL", "ssl_ca": "/no/such/ca.pem"}, "KDIV_SSL_CA=/no/such/ca.pem: no such file"),
        ({"security_protocol": "SSL", "ssl_key": "/no/such/key.pem"}, "KDIV_SSL_KEY=/no/such/key.pem: no such file"),
        ({"security_protocol": "SSL", "ssl_cert": "{client_cert}"}, "KDIV_SSL_CERT is set without KDIV_SSL_KEY"),
        ({"security_protocol": "SSL", "ssl_key": "{client_key}"}, "KDIV_SSL_KEY is set without KDIV_SSL_CERT"),
        ({"security_protocol": "SSL", "ssl_key_password": "x"}, "KDIV_SSL_KEY_PASSWORD is set without KDIV_SSL_KEY"),
        ({"security_protocol": "SSL", "ssl_ca": "{not_pem}"}, r"cannot load the TLS files \(KDIV_SSL_CA="),
        (
            {
                "security_protocol": "SSL",
                "ssl_cert": "{client_cert}",
                "ssl_key": "{client_key_enc}",
                "ssl_key_password": "wrong",
            },
            "cannot load the TLS files .*KDIV_SSL_KEY=",
        ),
        # Contradictions: a setting the protocol would ignore.
        (
            {"sasl_username": "u", "sasl_password": "p"},
            "KDIV_SASL_USERNAME, KDIV_SASL_PASSWORD set, but KDIV_SECURITY_PROTOCOL=PLAINTEXT does not use SASL",
        ),
        ({"ssl_ca": "{ca}"}, "KDIV_SSL_CA set, but KDIV_SECURITY_PROTOCOL=PLAINTEXT does not use TLS"),
        (
            {"security_protocol": "SSL", "sasl_mechanism": "PLAIN"},
            "KDIV_SASL_MECHANISM set, but .*=SSL does not use SASL",
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_username": "u",
                "sasl_password": "p",
                "ssl_check_hostname": "false",
            },
            "KDIV_SSL_CHECK_HOSTNAME set, but KDIV_SECURITY_PROTOCOL=SASL_PLAINTEXT does not use TLS",
        ),
        (
            {"security_protocol": "SSL", "ssl_check_hostname": "maybe"},
            "KDIV_SSL_CHECK_HOSTNAME='maybe' is not a boolean",
        ),
    ],
)
def test_bad_settings_name_the_variable(pki, values, named):
    values = {k: v.format(**{n: p for n, p in pki.items() if isinstance(p, Path)}) for k, v in values.items()}
    with pytest.raises(SettingsError, match=named):
        Settings.from_env({"KDIV_TOPICS": "t", **env_of(**values)})


def test_cli_commands_read_the_same_settings_and_report_them_by_name():
    result = CliRunner().invoke(
        kdiv, ["dump", "some-topic", "--bootstrap", "127.0.0.1:1"], env={"KDIV_SECURITY_PROTOCOL": "SASL_SSL"}
    )
    assert result.exit_code == 2
    assert "KDIV_SASL_USERNAME and KDIV_SASL_PASSWORD" in result.output


# -- every client kdiv builds gets the settings ----------------------------------------------


def _client_config(client) -> dict:
    return {
        "protocol": client._security_protocol,
        "mechanism": client._sasl_mechanism,
        "username": client._sasl_plain_username,
        "password": client._sasl_plain_password,
        "tls": client._ssl_context is not None,
    }


async def test_every_kafka_client_kdiv_builds_gets_the_settings(pki, tmp_path):
    env = {
        "KDIV_TOPICS": "orders",
        "KDIV_DATA_DIR": str(tmp_path / "data"),
        **env_of(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_username="kdiv",
            sasl_password="pw",
            ssl_ca=pki["ca"],
        ),
    }
    settings = Settings.from_env(env)
    security = settings.kafka_security
    cluster = ClusterView(tansu=False, topics=(WatchedTopic("orders", 2, None),))
    app, worker = build_app(settings, cluster, state_schema_id=1)
    expected = {"protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-256", "username": "kdiv", "password": "pw", "tls": True}

    consumer = incidents_consumer(settings)
    admin = discovery.admin_client(settings)
    reader = consume.standalone_consumer(settings.bootstrap, security=security)
    producer = produce.new_producer(settings.bootstrap, security=security)
    demo_admin = demo.admin_client(settings.bootstrap, security)
    detector = tansu.detection_client(settings.bootstrap, security)
    built = {
        "worker incidents consumer": consumer._client,
        "discovery admin": admin._client,
        "kdiv dump/validate consumer": reader._client,
        "DivWriter producer": producer.client,
        "kdiv demo admin": demo_admin._client,
        "broker detection": detector,
    }
    assert {name: _client_config(client) for name, client in built.items()} == dict.fromkeys(built, expected)
    # The confluent_kafka writer's Producer (librdkafka): the same settings, as its properties.
    confluent = producer_settings(settings.bootstrap, security=security)
    assert {k: confluent[k] for k in security.librdkafka_config()} == security.librdkafka_config()
    assert (confluent["security.protocol"], confluent["sasl.username"]) == ("SASL_SSL", "kdiv")

    # Faust: what its aiokafka driver hands its consumer, and its producer's own settings.
    assert isinstance(app.conf.broker_credentials, SASLCredentials)
    faust_consumer_auth = credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context)
    for auth in (faust_consumer_auth, app.producer._settings_auth()):
        assert auth["security_protocol"] == "SASL_SSL"
        assert (auth["sasl_mechanism"], auth["sasl_plain_username"], auth["sasl_plain_password"]) == (
            "SCRAM-SHA-256",
            "kdiv",
            "pw",
        )
        assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    await producer.stop()
    await detector.close()


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_librdkafka_accepts_and_loads_the_derived_config(pki, protocol):
    values = {
        "security_protocol": protocol,
        "ssl_ca": pki["ca"],
        "ssl_cert": pki["client_cert"],
        "ssl_key": pki["client_key_enc"],
        "ssl_key_password": "s3cret-key-pass",
    }
    if protocol == "SASL_SSL":
        values.update(sasl_mechanism="SCRAM-SHA-512", sasl_username="kdiv", sasl_password="pw")
    config = KafkaSecurity.from_env(env_of(**values)).librdkafka_config()
    # librdkafka reads the CA, certificate and key when the client is created, so a
    # wrong property name, value or file fails here; no broker is contacted.
    quiet = {"log_level": 0}
    confluent_kafka.Producer({**quiet, **config})
    confluent_kafka.Consumer({**quiet, **config, "group.id": "kdiv-reconcile"})
    with pytest.raises(confluent_kafka.KafkaException, match="ssl.key"):
        confluent_kafka.Producer({**quiet, **config, "ssl.key.password": "wrong"})


# -- the TLS context in a real handshake -----------------------------------------------------


async def _handshake(pki, security: KafkaSecurity, server_hostname: str) -> bool:
    """Connect to a local TLS server that requires a client certificate from `pki`'s CA;
    True when the server accepted the client's certificate."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pki["_server"].configure_cert(server_context)
    pki["_ca"].configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_REQUIRED
    seen: list = []

    async def on_client(reader, writer_):
        seen.append(writer_.get_extra_info("peercert"))
        writer_.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        _reader, writer_ = await asyncio.open_connection(
            "127.0.0.1", port, ssl=security.ssl_context(), server_hostname=server_hostname
        )
        await _reader.read()
        writer_.close()
    finally:
        server.close()
        await server.wait_closed()
    return bool(seen and seen[0])


async def test_the_context_verifies_the_broker_and_presents_the_client_certificate(pki):
    mutual = env_of(security_protocol="SSL", ssl_ca=pki["ca"], ssl_cert=pki["client_cert"], ssl_key=pki["client_key"])
    assert await _handshake(pki, KafkaSecurity.from_env(mutual), "localhost")

    # A broker certificate for another name fails unless the hostname check is off.
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        await _handshake(pki, KafkaSecurity.from_env(mutual), "kafka.example.com")
    unchecked = {**mutual, "KDIV_SSL_CHECK_HOSTNAME": "false"}
    assert await _handshake(pki, KafkaSecurity.from_env(unchecked), "kafka.example.com")

    # A broker signed by a CA other than KDIV_SSL_CA is refused.
    other = {**mutual, "KDIV_SSL_CA": str(pki["other_ca"])}
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(pki, KafkaSecurity.from_env(other), "localhost")
