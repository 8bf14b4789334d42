"""Bearer tokens -> teams.

Tokens come from FUSEWIRE_TOKENS ('tok=team,...') and/or FUSEWIRE_TOKENS_FILE ('tok=team'
lines). With neither configured the service runs in OPEN mode: every request is team
'dev', with or without a token, and a loud warning is logged at start-up. That is the
local-development default (`fusewire up` binds to localhost); configure tokens for
anything shared.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from fastapi import Request

from service.errors import ApiError

log = logging.getLogger("fusewire.auth")
OPEN_TEAM = "dev"


@dataclass(frozen=True)
class Auth:
    tokens: dict[str, str]  # token -> team

    @property
    def open(self) -> bool:
        return not self.tokens

    def announce(self) -> None:
        if self.open:
            log.warning("=" * 78)
            log.warning("AUTH IS OFF: no tokens configured (FUSEWIRE_TOKENS / FUSEWIRE_TOKENS_FILE).")
            log.warning("Every request is accepted as team '%s'. Keep this service on localhost.", OPEN_TEAM)
            log.warning("=" * 78)
        else:
            log.info("auth: %d tokens for %d teams", len(self.tokens), len(set(self.tokens.values())))

    def team_for(self, authorization: str | None) -> str:
        if self.open:
            return OPEN_TEAM
        if not authorization:
            raise ApiError(401, "unauthenticated", "missing 'Authorization: Bearer <token>' header",
                           headers={"WWW-Authenticate": "Bearer"})
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "unauthenticated", "the Authorization header must be 'Bearer <token>'",
                           headers={"WWW-Authenticate": "Bearer"})
        for known, team in self.tokens.items():  # constant-time per comparison; the table is small
            if hmac.compare_digest(known.encode(), token.encode()):
                return team
        raise ApiError(403, "forbidden", "unknown token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


async def require_team(request: Request) -> str:
    """FastAPI dependency: the caller's team, or 401/403."""
    return request.app.state.ctx.auth.team_for(request.headers.get("authorization"))
