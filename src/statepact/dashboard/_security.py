"""The dashboard's guards: the credential, the CSRF token, the response headers.

- Credential (standalone server): ``Authorization: Bearer <token>`` or HTTP Basic
  with the token as the password; compared in constant time. Mounted in an
  application, the application's own auth stands in front and no token is set.
- CSRF: a signed double-submit token. The cookie holds ``nonce.signature``
  (HMAC-SHA256 of the nonce under the app's secret); every form carries the same
  value, and a POST is accepted only when the form's value equals the cookie's
  and the signature holds. The cookie is ``SameSite=Strict`` and ``HttpOnly``.
- Headers: a Content-Security-Policy allowing only the dashboard's own script
  and style (no inline script), so even a value that escaped escaping could
  not run; no framing; no MIME sniffing.

This module must never log or render the token or the secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "SECURITY_HEADERS",
    "CsrfSigner",
    "credential_ok",
]

CSRF_COOKIE = "statepact_csrf"
CSRF_FIELD = "csrf"

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class CsrfSigner:
    """Issues and checks the double-submit token under one secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode("ascii"), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def valid(self, token: str | None) -> bool:
        """Whether ``token`` is one this signer issued."""
        if not token or token.count(".") != 1:
            return False
        nonce, signature = token.split(".")
        try:
            expected = self._sign(nonce)
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(expected, signature)

    def accepts(self, cookie: str | None, form: str | None) -> bool:
        """A POST's pair: the cookie is ours and the form repeats it."""
        if not cookie or not form:
            return False
        return hmac.compare_digest(cookie.encode(), form.encode()) and self.valid(cookie)


def credential_ok(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header presents ``token`` (Bearer, or Basic's password)."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    value = value.strip()
    expected = token.encode()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), expected)
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
        _, _, password = decoded.partition(b":")
        return hmac.compare_digest(password, expected)
    return False
