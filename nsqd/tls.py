"""TLS for nsqd: the server context built from the ``--tls-*`` flags, the client context used to reach
HTTPS auth servers, and the per-connection facts that IDENTIFY's upgrade records for /stats and AUTH.

The one server context serves both the TCP upgrade (``"tls_v1": true`` in IDENTIFY) and the HTTPS
listener (``--https-address``); ``server_ssl_context(opts)`` returns None when no certificate is
configured (nsqd then offers no TLS at all).

Client certificates (``--tls-client-auth-policy``):

- ``require-verify``: a certificate is required and must chain to ``--tls-root-ca-file`` (the
  system roots when no file is given).
- ``require``: a certificate is required. nsqd accepts any certificate here; Python's ``ssl``
  module cannot accept a certificate it has not verified, so here it must chain to the root CA
  file too (or the system roots). This is the one known difference from nsqd.
- no policy: with ``--tls-root-ca-file`` a certificate is asked for, optional, and checked when
  given; without it none is asked for.

``--tls-min-version``: ``tls1.2`` and ``tls1.3`` raise the context's minimum. Lower values leave it at
TLS 1.2, the floor of OpenSSL 3's default security level (TLS 1.0/1.1 need SHA-1 signatures it
refuses); no NSQ client of today negotiates below TLS 1.2.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = [
    "TLSConfigError",
    "TLSInfo",
    "client_ssl_context",
    "go_cipher_suite_name",
    "server_ssl_context",
    "tls_info",
]

_MIN_VERSIONS = {"tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}

# OpenSSL's names for the suites as nsqd reports them in /stats (IANA names; TLS 1.3 suites are
# already spelled that way by OpenSSL).
_CIPHER_SUITE_NAMES = {
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-RSA-AES128-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-ECDSA-AES128-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-DES-CBC3-SHA": "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "DHE-RSA-AES128-GCM-SHA256": "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256",
    "DHE-RSA-AES256-GCM-SHA384": "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384",
    "DHE-RSA-CHACHA20-POLY1305": "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "AES128-GCM-SHA256": "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "AES256-GCM-SHA384": "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "AES128-SHA256": "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
}


class TLSConfigError(ValueError):
    """The TLS flags cannot be turned into a context; nsqd refuses to start."""


def _failed(exc: BaseException) -> TLSConfigError:
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.filename:
        detail = f"open {exc.filename}: {(exc.strerror or str(exc)).lower()}"
    else:
        detail = str(exc)
    return TLSConfigError(f"failed to build TLS config - {detail}")


def _load_roots(context: ssl.SSLContext, root_ca_file: str, purpose: ssl.Purpose) -> None:
    if root_ca_file:
        try:
            context.load_verify_locations(cafile=root_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _failed(exc) from exc
    else:
        context.load_default_certs(purpose)


def _apply_min_version(context: ssl.SSLContext, word: str) -> None:
    wanted = _MIN_VERSIONS.get(word)
    if wanted is not None and wanted > context.minimum_version:
        context.minimum_version = wanted


def server_ssl_context(opts) -> ssl.SSLContext | None:
    """The context for TLS clients (TCP upgrade and HTTPS), or None without ``--tls-cert``/``--tls-key``.

    Raises ``TLSConfigError`` (nsqd's ``failed to build TLS config - ...``) for unreadable files.
    """
    if not (opts.tls_cert or opts.tls_key):
        return None
    if not (opts.tls_cert and opts.tls_key):
        raise TLSConfigError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(opts.tls_cert, opts.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise _failed(exc) from exc
    policy = opts.tls_client_auth_policy
    if policy in ("require", "require-verify"):
        context.verify_mode = ssl.CERT_REQUIRED
        _load_roots(context, opts.tls_root_ca_file, ssl.Purpose.CLIENT_AUTH)
    elif opts.tls_root_ca_file:
        context.verify_mode = ssl.CERT_OPTIONAL
        _load_roots(context, opts.tls_root_ca_file, ssl.Purpose.CLIENT_AUTH)
    else:
        context.verify_mode = ssl.CERT_NONE
    _apply_min_version(context, opts.tls_min_version)
    return context


def client_ssl_context(opts) -> ssl.SSLContext:
    """The context nsqd uses as an HTTPS client (auth servers): ``--tls-root-ca-file`` as roots."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if opts.tls_root_ca_file:
        try:
            context.load_verify_locations(cafile=opts.tls_root_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _failed(exc) from exc
    _apply_min_version(context, opts.tls_min_version)
    return context


def go_cipher_suite_name(openssl_name: str) -> str:
    """The name nsqd's /stats gives a cipher suite (OpenSSL's own name when it has no other)."""
    return _CIPHER_SUITE_NAMES.get(openssl_name, openssl_name)


@dataclass(frozen=True)
class TLSInfo:
    """What a finished handshake tells: ``version`` as ``TLS1.2``, the suite's IANA name, the ALPN
    protocol ("" when none) and the client certificate's common name ("" without one)."""

    version: str
    cipher_suite: str
    negotiated_protocol: str
    common_name: str


def tls_info(ssl_object) -> TLSInfo:
    """Facts of a finished handshake from an ``ssl.SSLObject`` or a ``trio.SSLStream`` (which forwards them)."""
    version = (ssl_object.version() or "").replace("TLSv", "TLS")
    if version == "TLS1":
        version = "TLS1.0"
    cipher = ssl_object.cipher()
    common_name = ""
    peer = ssl_object.getpeercert() or {}
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                common_name = value
                break
        if common_name:
            break
    return TLSInfo(
        version=version,
        cipher_suite=go_cipher_suite_name(cipher[0]) if cipher else "",
        negotiated_protocol=ssl_object.selected_alpn_protocol() or "",
        common_name=common_name,
    )
