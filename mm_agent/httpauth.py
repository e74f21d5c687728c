"""Bearer-token authentication for `mm-agent serve --transport http`.

The HTTP transport binds loopback only, and the SDK refuses foreign Host/Origin headers (DNS rebinding), but
every local user and process can still reach the port, and its tools write files and start runs as the
server's user. A token shared only with the MCP client closes that. It comes from `--auth-token-file FILE`
(one line; the file readable by its owner only) or `$MM_AGENT_HTTP_TOKEN`. Without one the server still
serves loopback and logs a warning at start, as before (no generated token: a client configured today keeps
working, and the operator decides).

The check is the SDK's own: an `AuthSettings` plus a `TokenVerifier` given to `MCPServer` make its
`RequireAuthMiddleware` answer 401 to a request without `Authorization: Bearer <token>` or with another token,
before any MCP message is read. No OAuth routes are served (no authorization server, no resource metadata).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl

from mm_agent.errors import MMAgentError, os_error

TOKEN_ENV = "MM_AGENT_HTTP_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
CLIENT_ID = "mm-agent-http-client"
# RFC 6750 b64token: what a client can put after "Bearer " unquoted
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAKE_ONE = (
    "make one with `umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE` and give "
    "the client the header `Authorization: Bearer <that token>`"
)


class StaticTokenVerifier:
    """The SDK's `TokenVerifier` for one shared token, compared in constant time (by digest, so the
    comparison time says nothing about the token's length either)."""

    def __init__(self, token: str) -> None:
        self._digest = hashlib.sha256(token.encode()).digest()

    async def verify_token(self, token: str) -> AccessToken | None:
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            return None
        return AccessToken(token=token, client_id=CLIENT_ID, scopes=[])


def server_auth(token: str | None) -> dict[str, Any]:
    """`MCPServer` keyword arguments that require `token` on every HTTP request (none without a token)."""
    if token is None:
        return {}
    # The SDK's settings need an issuer URL; it is used only for OAuth routes and resource metadata, neither
    # of which is served here (no provider, no resource_server_url).
    settings = AuthSettings(issuer_url=AnyHttpUrl("http://127.0.0.1"), resource_server_url=None)
    return {"auth": settings, "token_verifier": StaticTokenVerifier(token)}


def check_token(token: str, source: str, field: str) -> str:
    token = token.strip()
    if not _TOKEN.fullmatch(token):
        raise MMAgentError(
            f"the token in {source} is not one line of token characters (A-Z a-z 0-9 - . _ ~ + / =)",
            field=field,
            fix=MAKE_ONE,
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise MMAgentError(
            f"the token in {source} has {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed",
            field=field,
            fix=MAKE_ONE,
        )
    return token


def read_token_file(path: Path) -> str:
    """The token in `path`: a regular file only its owner may read (as ssh insists for keys)."""
    field = "--auth-token-file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise MMAgentError(os_error(exc).message, file=str(path), field=field, fix=MAKE_ONE) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MMAgentError("not a regular file", file=str(path), field=field, fix=MAKE_ONE)
        if st.st_mode & 0o077:
            raise MMAgentError(
                f"others may read or change it (mode {stat.S_IMODE(st.st_mode):04o})",
                file=str(path),
                field=field,
                fix=f"chmod 600 {path}",
            )
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_BYTES:
        raise MMAgentError("too long for a token file", file=str(path), field=field, fix=MAKE_ONE)
    return check_token(data.decode("utf-8", "replace"), str(path), field)


def load_token(path: Path | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(the token, where it came from): the file when given, else `$MM_AGENT_HTTP_TOKEN`, else none."""
    if path is not None:
        return read_token_file(path), str(path)
    value = env.get(TOKEN_ENV)
    if value:
        return check_token(value, f"${TOKEN_ENV}", TOKEN_ENV), f"${TOKEN_ENV}"
    return None, ""
