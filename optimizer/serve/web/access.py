"""Who a request comes from and what their token lets them do.

A token comes in the ``Authorization: Bearer`` header. The console's pages, which a browser fetches without that
header, may also send it in the ``fleetfit-token`` cookie the console's script sets, and only for reads: a change
needs the header, which no other site's page can make a browser send (the cookie is also ``SameSite=Strict``).
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from urllib.parse import unquote

from aiohttp import web

from optimizer.serve.config import ApiSettings
from optimizer.serve.tokens import Holder, Role, Tokens, allows

log = logging.getLogger(__name__)

COOKIE = "fleetfit-token"
_MAX_TOKEN = 512  # far above any token fleetfit makes (43 characters); a longer header is no token of ours


class Access:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        shared = settings.token.get_secret_value() if settings.token is not None else None
        self.tokens = Tokens(settings.tokens_file, shared)
        self.refused: Counter[str] = Counter()  # 401 and 403, by reason
        self._proxies = settings.trusted_proxies

    @property
    def configured(self) -> bool:
        """Whether any token may be in force (with none, every change is refused)."""
        return self.tokens.path is not None or self.tokens.shared

    def client(self, request: web.Request) -> str:
        """The client's address: the peer's, or when the peer is a trusted proxy, the last address in
        X-Forwarded-For that is not one (the proxies append; what comes before them the client could have written)."""
        peer = request.remote or "unknown"
        if not self._proxies or not self._trusted(peer):
            return peer
        chain = [a.strip() for h in request.headers.getall("X-Forwarded-For", []) for a in h.split(",")]
        for address in reversed(chain):
            if not self._trusted(address):
                try:
                    return str(ipaddress.ip_address(address))
                except ValueError:
                    return f"{peer} (forwarded for an unreadable address)"
        return peer

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self._proxies)

    def _given(self, request: web.Request, cookie: bool) -> str | None:
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
        if cookie and COOKIE in request.cookies:
            return unquote(request.cookies[COOKIE])
        return None

    def holder(self, request: web.Request, cookie: bool = False) -> Holder:
        """The holder of the request's token; 401 (counted by reason) for no token or one not in force."""
        given = self._given(request, cookie)
        if given is None:
            self._refuse("no_token")
            raise web.HTTPUnauthorized(text="a bearer token is required\n", headers={"WWW-Authenticate": "Bearer"})
        if not given.isascii():  # a bearer token is ASCII; anything else is no credential at all
            self._refuse("malformed")
            raise web.HTTPBadRequest(text="the bearer token is not ASCII\n")  # from the header or the cookie
        if len(given) > _MAX_TOKEN:  # not a token of ours, nor worth hashing
            self._refuse("malformed")
            raise web.HTTPUnauthorized(
                text="a valid bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        found = self.tokens.holder(given) if given else None
        if found is None:
            self._refuse("unknown_token")
            raise web.HTTPUnauthorized(
                text="a valid bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        return found

    def permit(self, holder: Holder, needed: Role) -> None:
        """403 (counted) when ``holder``'s role is below ``needed``."""
        if not allows(holder.role, needed):
            self._refuse("role")
            raise web.HTTPForbidden(
                text=f"{holder.name} is a {holder.role.value}; this needs {needed.value} or above\n"
            )

    def require(self, request: web.Request, needed: Role, cookie: bool = False) -> Holder:
        """The request's holder, when their role allows what needs ``needed``; else 401 or 403."""
        found = self.holder(request, cookie)
        self.permit(found, needed)
        return found

    def _refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        if self.refused[reason] in (1, 100) or self.refused[reason] % 10_000 == 0:
            log.warning("API: request refused (%s), %d so far", reason, self.refused[reason])
