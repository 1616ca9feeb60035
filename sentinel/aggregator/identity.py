"""Who may speak to the aggregator: the agents' tokens file, host-name globs, TLS and mutual-TLS contexts.

A bearer token is bound to the host names it may speak for (``TOKEN HOSTGLOB ...`` per line of the tokens
file); with mutual TLS a client certificate's names bind it further. :class:`TokenBook` answers which grants
a request's ``Authorization`` header holds, comparing every token in constant time. The stream
(:mod:`.stream`) and the REST read token (:mod:`.rest`) are built on these.
"""

from __future__ import annotations

import fnmatch
import hmac
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.config.aggregator import ServerConfig
from sentinel.config.loader import read_bounded

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
HOST_GLOB = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,253}$")
MAX_TOKEN_BYTES = 4096
MAX_TOKENS = 10000


class TokenError(Exception):
    """The tokens file cannot be used (one line naming it and what is wrong)."""


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """One line of the tokens file: a bearer token and the host names it may speak for.

    ``hosts`` holds shell-style globs (``host-0*``); empty means any host name (a token-only line, kept for
    small labs and reported as a warning at start-up, since any holder can then speak for every host).
    """

    token: bytes
    hosts: tuple[str, ...] = ()
    line: int = 0

    @property
    def any_host(self) -> bool:
        return not self.hosts

    def allows(self, host: str) -> bool:
        return not self.hosts or any(fnmatch.fnmatchcase(host, glob) for glob in self.hosts)


def parse_token_line(line: str, number: int = 0) -> TokenGrant | None:
    """``TOKEN [HOSTGLOB ...]`` → a grant; None for a blank or ``#`` comment line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    token, *globs = text.split()
    if len(token.encode()) > MAX_TOKEN_BYTES:
        raise TokenError(f"token {number}: longer than {MAX_TOKEN_BYTES} bytes")
    for glob in globs:
        if not HOST_GLOB.match(glob):
            raise TokenError(f"token {number}: {glob[:80]!r} is not a host name glob")
    return TokenGrant(token.encode(), tuple(globs), number)


def load_tokens(path: Path) -> list[TokenGrant]:
    """The grants of a tokens file: ``TOKEN HOSTGLOB`` per line (blank lines and ``#`` comments ignored)."""
    try:
        raw = read_bounded(path, MAX_TOKENS * (MAX_TOKEN_BYTES + 1))
    except OSError as exc:
        raise TokenError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TokenError(f"{path}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    grants: list[TokenGrant] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            grant = parse_token_line(line, number)
        except TokenError as exc:
            raise TokenError(f"{path}: line {exc}") from None
        if grant is not None:
            grants.append(grant)
    if not grants:
        raise TokenError(f"{path}: no token in the file")
    return grants


def as_grants(tokens: Iterable[str | TokenGrant]) -> list[TokenGrant]:
    """Tokens given in code (tests, the demo): grants as they are, strings parsed as tokens-file lines."""
    grants: list[TokenGrant] = []
    for number, item in enumerate(tokens, 1):
        grant = item if isinstance(item, TokenGrant) else parse_token_line(item, number)
        if grant is not None and grant.token:
            grants.append(grant)
    return grants


def server_ssl_context(server: ServerConfig) -> ssl.SSLContext | None:
    """The listener's TLS context (None: plain http/ws); raises :class:`TokenError` naming the bad file."""
    if not server.tls_cert_file:
        if server.tls_client_ca_file:
            raise TokenError("server.tls_client_ca_file: mutual TLS needs server.tls_cert_file too")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(server.tls_cert_file, server.tls_key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise TokenError(f"{server.tls_cert_file}: cannot load the certificate/key: {exc}") from None
    if server.tls_client_ca_file:
        try:
            context.load_verify_locations(cafile=server.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TokenError(f"{server.tls_client_ca_file}: cannot load the client CA: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_names(peercert: Any) -> tuple[str, ...]:
    """The DNS subjectAltNames and common name of a verified peer certificate (``getpeercert()``)."""
    if not isinstance(peercert, dict):
        return ()
    names = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    for rdn in peercert.get("subject", ()):
        names.extend(value for key, value in rdn if key == "commonName")
    return tuple(str(name) for name in names)


def load_api_tokens(path: Path) -> list[bytes]:
    """The REST API's read tokens, one per line (blank lines and ``#`` comments ignored)."""
    return [grant.token for grant in load_tokens(path)]


class TokenBook:
    """The accepted grants, and which of them a request's bearer token holds."""

    def __init__(self, grants: Iterable[TokenGrant]) -> None:
        self.grants = tuple(grants)

    def grants_for(self, header: str) -> list[TokenGrant]:
        """The grants of the bearer token in ``header`` (empty: not a valid token).

        Every accepted token is compared, in constant time, so timing tells nothing about which matched.
        """
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return []
        given = token.strip().encode()[:MAX_TOKEN_BYTES]
        matched = []
        for grant in self.grants:
            if hmac.compare_digest(given, grant.token):
                matched.append(grant)
        return matched

    def token_ok(self, header: str) -> bool:
        return bool(self.grants_for(header))
