"""Who may see a dashboard page: the API's own tokens (service/auth.py); every page is read-only.

A browser cannot send a bearer header by itself, so the login form (POST /ui/login) checks a
token against the same table and keeps it in an HttpOnly, SameSite=Strict cookie scoped to
/ui. Every request checks the cookie (or a bearer header, for scripts) against the table
again, so a token removed from the table stops working at once. Without a valid one, a
browser is sent to the login page and any other client gets the API's 401/403. In open mode
(no tokens configured) every page is served, under an "auth is off" banner.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from service.auth import OPEN_TEAM, Auth
from service.errors import ApiError

COOKIE = "fusewire_ui"
COOKIE_PATH = "/ui"
COOKIE_MAX_AGE_S = 12 * 3600


class LoginRequired(Exception):
    """A browser without a valid token: the page route answers with a redirect to the login page."""

    def __init__(self, next_path: str, expired: bool) -> None:
        super().__init__(next_path)
        self.next_path, self.expired = next_path, expired


def team_of(auth: Auth, token: str) -> str | None:
    """The token's team, or None when the table does not know it."""
    try:
        return auth.team_for(f"Bearer {token}")
    except ApiError:
        return None


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


async def viewer(request: Request) -> str:
    """FastAPI dependency of every page: the viewer's team (OPEN_TEAM in open mode)."""
    auth: Auth = request.app.state.ctx.auth
    if auth.open:
        return OPEN_TEAM
    header = request.headers.get("authorization")
    if header:
        return auth.team_for(header)  # 401/403 exactly as the API answers them
    token = request.cookies.get(COOKIE)
    team = team_of(auth, token) if token else None
    if team is not None:
        return team
    if wants_html(request):
        query = request.url.query
        raise LoginRequired(request.url.path + (f"?{query}" if query else ""), expired=bool(token))
    raise ApiError(401, "unauthenticated",
                   "the dashboard needs 'Authorization: Bearer <token>' or a login at /ui/login",
                   headers={"WWW-Authenticate": "Bearer"})


def safe_next(path: str | None) -> str:
    """Where to go after logging in: a dashboard path on this site, never another site."""
    if not path or not path.startswith(COOKIE_PATH) or path.startswith("//") or "\\" in path:
        return COOKIE_PATH
    parts = urlsplit(path)
    return path if not parts.scheme and not parts.netloc else COOKIE_PATH


def same_origin(request: Request) -> bool:
    """A form POST from our own pages (login CSRF): Origin, else Referer, names this host when present."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")
