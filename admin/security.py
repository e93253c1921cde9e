"""Who may run actions, and proof that an action request comes from the admin's own pages.

Admins: with no ``--admin-user`` everyone is an admin (nsqadmin's rule); otherwise only a request whose
``--acl-http-header`` (set by the authenticating proxy in front of the admin) names one of them. Anyone else
gets 403 ``FORBIDDEN``.

Cross-site request forgery: a page of another site can make the browser send a POST or DELETE to the admin
with the user's proxy credentials. Every mutating ``/api`` call therefore has to carry the header
``X-CSRF-Token`` with a token that only the admin's own pages (and ``GET /api/session``) hand out: an HMAC of
the user name under a secret made at start-up. Another origin cannot read those pages, and a plain HTML form
cannot set a header. In addition a request whose ``Origin`` names another host, or that the browser marks
``Sec-Fetch-Site: cross-site``/``same-site``, is refused whatever it carries. Failures are 403
``INVALID_CSRF_TOKEN`` / ``CROSS_ORIGIN_REQUEST``. A restart makes a new secret, so open pages need a reload.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from protocol.http import HTTPError, Request

__all__ = ["CSRF_HEADER", "Guard"]

CSRF_HEADER = "X-CSRF-Token"


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
        return hmac.new(self.secret, b"csrf\0" + self.user(request).encode("utf-8", "replace"),
                        hashlib.sha256).hexdigest()

    def check_action(self, request: Request) -> None:
        """Raise 403 unless ``request`` may change the cluster."""
        if not self.is_admin(request):
            raise HTTPError(403, "FORBIDDEN")
        origin = request.headers.get("Origin")
        host = request.headers.get("Host", "")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc != host):
            raise HTTPError(403, "CROSS_ORIGIN_REQUEST")
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise HTTPError(403, "CROSS_ORIGIN_REQUEST")
        sent = request.headers.get(CSRF_HEADER, "")
        if not sent or not hmac.compare_digest(sent.encode("latin-1"), self.token(request).encode("ascii")):
            raise HTTPError(403, "INVALID_CSRF_TOKEN")
