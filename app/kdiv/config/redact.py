"""Credentials out of URLs before they are shown or logged.

A URL may carry user info (`http://user:password@host`); kdiv takes it apart when it reads its
settings (`split_userinfo`), so the URLs it keeps, shows in views and reports, and puts in
error messages and log lines carry none. `redacted` removes user info from any text that
still might (a message from a library that saw a URL).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

# scheme://userinfo@ : the user info of a URL inside any text.
# Greedy to the last "@" before the path: a password may hold an unescaped "@".
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# user:password@host[:port] in a comma-separated list of servers without a scheme.
_BARE_USERINFO = re.compile(r"(?P<start>^|[,\s])[^,/?#@\s:]+:[^,/?#\s]*@")


def redacted(text: str) -> str:
    """`text` with the user info of every URL in it removed."""
    return _BARE_USERINFO.sub(r"\g<start>", _USERINFO.sub(r"\g<scheme>", text))


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without user info, "user:password" percent-decoded or None when it has none)."""
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return url.strip(), None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), f"{unquote(user)}:{unquote(password)}"
