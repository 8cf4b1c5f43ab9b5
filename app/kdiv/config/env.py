"""Reading ``KDIV_*`` environment variables: every bad value names its variable."""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from pathlib import Path

PREFIX = "KDIV_"


class SettingsError(ValueError):
    pass


# What RFC 6750 allows in a bearer token; at least 16 characters, so it cannot be guessed.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]{16,}=*")


# A host name, IPv4 or bracketed IPv6 address, or a pattern of one, with an optional port.
_HOST_PATTERN = re.compile(r"(\[[0-9a-f:.*?]+\]|[a-z0-9*?\[\]!_.-]+)(:[0-9*?]+)?")


class EnvReader:
    def __init__(self, environ: Mapping[builtins.str, builtins.str]) -> None:
        self._environ = environ

    def str(self, name: builtins.str, default: builtins.str) -> builtins.str:
        value = self._environ.get(PREFIX + name, "").strip()
        return value or default

    def int(self, name: builtins.str, default: builtins.int, *, minimum: builtins.int) -> builtins.int:
        raw = self.str(name, "")
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name}={raw!r} is not an integer") from None
        if value < minimum:
            raise SettingsError(f"{PREFIX}{name}={value} is below {minimum}")
        return value

    def float(self, name: builtins.str, default: builtins.float) -> builtins.float:
        raw = self.str(name, "")
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name}={raw!r} is not a number") from None
        if value <= 0:
            raise SettingsError(f"{PREFIX}{name}={value} must be positive")
        return value

    def bool(self, name: builtins.str, default: builtins.bool) -> builtins.bool:
        raw = self.str(name, "").lower()
        if not raw:
            return default
        if raw in ("1", "true", "yes", "on"):
            return True
        if raw in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{PREFIX}{name}={raw!r} is not a boolean (true/false)")

    def web_token(self, name: builtins.str) -> builtins.str:
        token = self.str(name, "")
        if token and not _TOKEN.fullmatch(token):
            raise SettingsError(
                f"{PREFIX}{name} must be at least 16 characters of A-Z a-z 0-9 - . _ ~ + / (e.g. `openssl rand -hex 32`)"
            )
        return token

    def host_names(self, name: builtins.str) -> tuple[builtins.str, ...]:
        """Comma-separated host names or patterns (``*``, ``?``, ``[...]``), lower-cased; an
        optional ``:port`` stays on."""
        names = []
        for item in (part.strip().lower() for part in self.str(name, "").split(",")):
            if not item:
                continue
            if not _HOST_PATTERN.fullmatch(item):
                raise SettingsError(f"{PREFIX}{name}: {item!r} is not a host name, address or pattern (e.g. kdiv-*)")
            names.append(item.rstrip("."))
        return tuple(names)

    def choice(self, name: builtins.str, choices: tuple[builtins.str, ...], default: builtins.str) -> builtins.str:
        value = self.str(name, default)
        if value not in choices:
            raise SettingsError(f"{PREFIX}{name}={value!r} is not one of {', '.join(choices)}")
        return value

    def file(self, name: builtins.str) -> Path | None:
        raw = self.str(name, "")
        if not raw:
            return None
        path = Path(raw)
        if not path.is_file():
            raise SettingsError(f"{PREFIX}{name}={raw}: no such file")
        return path

    def mapping(self, name: builtins.str, parse, expected: builtins.str) -> dict[builtins.str, object]:
        """ "orders=record,*=topic" or a bare value for every topic."""
        found: dict[builtins.str, object] = {}
        for item in (part.strip() for part in self.str(name, "").split(",")):
            if not item:
                continue
            topic, sep, raw = item.rpartition("=")
            value = parse(raw.strip())
            if value is None:
                raise SettingsError(f"{PREFIX}{name}: {item!r} is not TOPIC=VALUE or VALUE with VALUE {expected}")
            found[topic.strip() if sep else "*"] = value
        return found

    def compaction_lags(self, name: builtins.str) -> dict[builtins.str, builtins.int]:
        """ "orders=3600000,*=0" or a bare number for every topic."""
        raw = self.str(name, "")
        lags: dict[builtins.str, builtins.int] = {}
        for item in (part.strip() for part in raw.split(",")):
            if not item:
                continue
            topic, sep, ms = item.rpartition("=")
            topic = topic.strip() if sep else "*"
            try:
                lags[topic] = int(ms)
            except ValueError:
                raise SettingsError(f"{PREFIX}{name}: {item!r} is not TOPIC=MS or MS") from None
            if lags[topic] < 0:
                raise SettingsError(f"{PREFIX}{name}: {item!r} is negative")
        return lags
