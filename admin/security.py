"""Who may run actions, and proof that an action request comes from the admin's own pages.

Admins: with no ``--admin-user`` everyone is an admin (nsqadmin's rule); otherwise only a request whose
``--acl-http-header`` (set by the authenticating proxy in front of the admin) names one of them. Anyone else
gets 403 ``FORBIDDEN``.

Cross-site request forgery: a page of another site can make the browser send a POST or DELETE to the admin
with the user's credentials (cookies, a proxy's login). Browsers mark such requests, and only browsers do: every
POST or DELETE a browser sends carries ``Origin`` (``null`` when the page hides where it comes from), and
browsers add ``Referer``, ``Cookie`` and ``Sec-Fetch-*`` headers. So the rule for a mutating ``/api`` call is:

- a request with none of those signals comes from a program (curl, a script, nsqadmin's own API clients) and
  needs no token, as with nsqadmin: scripts written for nsqadmin keep working unchanged;
- a request with one of them is refused with 403 ``CROSS_ORIGIN_REQUEST`` when it comes from another origin
  (``Origin`` or, without it, ``Referer`` naming another host than ``Host``; ``Origin: null``;
  ``Sec-Fetch-Site: cross-site`` or ``same-site``), and otherwise must carry the header ``X-CSRF-Token`` with the
  token that only the admin's own pages (and ``GET /api/session``) hand out: an HMAC of the user name under a
  secret made at start-up, which another origin cannot read. A missing or wrong token is 403
  ``INVALID_CSRF_TOKEN``. A restart makes a new secret, so open pages need a reload.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from protocol.http import HTTPError, Request

__all__ = ["BROWSER_SIGNALS", "CSRF_HEADER", "Guard"]

CSRF_HEADER = "X-CSRF-Token"
#: headers that only a browser adds by itself: a request with none of them needs no CSRF token
BROWSER_SIGNALS = ("Origin", "Referer", "Cookie", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest")


def _netloc(url: str) -> str | None:
    try:
        return urlsplit(url).netloc
    except ValueError:
        return None


class Guard:
    def __init__(self, opts, secret: bytes | None = None) -> None:
        self.opts = opts
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    def user(self, request: Request) -> str:
        return request.headers.get(self.opts.acl_http_header, "") or ""

    def is_admin(self, request: Request) -> bool:
        admins = self.opts.admin_users
        return not admins or self.user(request) in admins

    def token(self, request: Request) -> str:
        return hmac.new(
            self.secret, b"csrf\0" + self.user(request).encode("utf-8", "replace"), hashlib.sha256
        ).hexdigest()

    def check_action(self, request: Request) -> None:
        """Raise 403 unless ``request`` may change the cluster (see the module notes)."""
        if not self.is_admin(request):
            raise HTTPError(403, "FORBIDDEN")
        headers = request.headers
        if not any(name in headers for name in BROWSER_SIGNALS):
            return  # not a browser: nothing can have forged it
        origin = headers.get("Origin") or headers.get("Referer")
        if origin is not None and (origin == "null" or _netloc(origin) != headers.get("Host", "")):
            raise HTTPError(403, "CROSS_ORIGIN_REQUEST")
        if headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise HTTPError(403, "CROSS_ORIGIN_REQUEST")
        sent = headers.get(CSRF_HEADER, "")
        if not sent or not hmac.compare_digest(sent.encode("latin-1"), self.token(request).encode("ascii")):
            raise HTTPError(403, "INVALID_CSRF_TOKEN")
