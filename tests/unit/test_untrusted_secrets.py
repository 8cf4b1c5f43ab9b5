"""A password in a URL kdiv is given is used, and never shown: not in settings errors, the
registry client's URL and errors, its request log, nor a report."""

from __future__ import annotations

import base64
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kdiv.config.env import SettingsError
from kdiv.config.redact import redacted, split_userinfo
from kdiv.config.settings import RegistrySettings, Settings
from kdiv.reconcile import report
from kdiv.registry.client import RegistryUnavailable, SchemaNotFound, SchemaRegistry, client_config

PASSWORD = "pl4nted-S3cret"


def test_user_info_is_taken_out_of_urls_and_texts():
    assert split_userinfo(f"http://kdiv:{PASSWORD}@registry:8081/ccompat") == (
        "http://registry:8081/ccompat",
        f"kdiv:{PASSWORD}",
    )
    assert split_userinfo("https://registry:8081") == ("https://registry:8081", None)
    assert split_userinfo("http://us%40er:p%3Aw@h") == ("http://h", "us@er:p:w")
    text = f"cannot reach http://kdiv:{PASSWORD}@h:1/x, nor SASL_SSL://u:{PASSWORD}@b@k:9093 or u:{PASSWORD}@k2:9092"
    assert PASSWORD not in redacted(text)
    assert redacted(text) == "cannot reach http://h:1/x, nor SASL_SSL://k:9093 or k2:9092"


def test_registry_credentials_in_the_url_become_basic_auth():
    settings = RegistrySettings.from_env(
        {"KDIV_SCHEMA_REGISTRY_URL": f"http://kdiv:{PASSWORD}@registry:8081,http://kdiv:{PASSWORD}@other:8081"}
    )
    assert settings.url == "http://registry:8081,http://other:8081"
    assert settings.basic_auth == f"kdiv:{PASSWORD}"
    assert PASSWORD not in repr(settings)


@pytest.mark.parametrize(
    "env",
    [
        {"KDIV_SCHEMA_REGISTRY_URL": f"ftp://kdiv:{PASSWORD}@registry"},
        {"KDIV_SCHEMA_REGISTRY_URL": f"kdiv:{PASSWORD}@registry:8081"},
        {"KDIV_SCHEMA_REGISTRY_URL": f"http://kdiv:{PASSWORD}@r", "KDIV_SCHEMA_REGISTRY_BASIC_AUTH": "a:b"},
        {"KDIV_SCHEMA_REGISTRY_URL": f"http://kdiv:{PASSWORD}@r,http://other:{PASSWORD}x@r2"},
        {"KDIV_BOOTSTRAP": f"kdiv:{PASSWORD}@broker:9092", "KDIV_TOPICS": "t"},
    ],
)
def test_settings_errors_do_not_repeat_the_password(env):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"KDIV_TOPICS": "t", **env})
    assert PASSWORD not in str(refused.value)


async def test_the_registry_client_sends_the_credentials_and_shows_and_logs_none(caplog):
    seen: list[str | None] = []

    async def not_found(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"error_code": 40403, "message": "Schema not found"}, status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", not_found)
    async with TestServer(app, host="127.0.0.1") as server:
        port = server.port
        settings = RegistrySettings.from_env({"KDIV_SCHEMA_REGISTRY_URL": f"http://kdiv:{PASSWORD}@127.0.0.1:{port}"})
        assert PASSWORD not in client_config(settings)["url"]
        registry = SchemaRegistry(settings)
        caplog.set_level(logging.DEBUG)
        try:
            with pytest.raises(SchemaNotFound) as missing:
                await registry.schema_text(7)
        finally:
            await registry.close()
    assert seen == ["Basic " + base64.b64encode(f"kdiv:{PASSWORD}".encode()).decode()]
    assert PASSWORD not in str(missing.value) and PASSWORD not in registry.url
    assert f"HTTP Request: GET http://127.0.0.1:{port}/schemas/ids/7" in caplog.text  # logged...
    assert PASSWORD not in caplog.text  # ...without the password


async def test_a_registry_made_with_user_info_in_its_url_keeps_it_out_of_errors():
    registry = SchemaRegistry(RegistrySettings(url=f"http://kdiv:{PASSWORD}@127.0.0.1:9", timeout_s=0.5))
    try:
        with pytest.raises(RegistryUnavailable) as failed:
            await registry.schema_text(1)
    finally:
        await registry.close()
    assert PASSWORD not in str(failed.value) and "127.0.0.1:9" in str(failed.value)


def test_a_failure_report_does_not_repeat_a_password_its_error_quotes(tmp_path):
    written = report.write_failure_report(
        {"error": f"registry http://kdiv:{PASSWORD}@registry:8081 did not answer", "finished_at_ms": 0}, tmp_path
    )
    for path in (written.summary_json, written.report_html):
        text = path.read_text(encoding="utf-8")
        assert "http://registry:8081 did not answer" in text
        assert PASSWORD not in text
