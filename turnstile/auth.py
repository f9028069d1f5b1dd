"""Credentials: the trainer's token and the per-session capabilities harnesses hold.

* The **trainer token** allows every route. ``turnstile serve`` takes it from ``--token`` or
  ``$TURNSTILE_TOKEN``; otherwise it reads ``<data>/turnstile.token`` or, the first time,
  generates one there (mode 0600). Clients send ``Authorization: Bearer <token>``.
* A **session capability** (``cap_`` + 256 random bits) is minted with each session and kept
  in its row. It is the key in the session's base URL (``/s/<capability>/v1``) and may also
  be sent as the API key (``Authorization: Bearer <capability>`` on ``/v1/...``). It allows
  chat completions and the model list for that one session, nothing else.

Used by the server and by :class:`turnstile.Client` (which reads the token file given
``data=``), so nothing here imports the server.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat
from pathlib import Path

TOKEN_ENV = "TURNSTILE_TOKEN"
TOKEN_FILE = "turnstile.token"
MIN_TOKEN_CHARS = 16
_DB_SUFFIXES = (".sqlite3", ".sqlite", ".db")


class AuthSetupError(RuntimeError):
    """The server cannot start with these credentials (message says why and what to do)."""


def token_path(data: str | Path) -> Path:
    """Where the trainer token lives for a ``--data`` directory (or store file)."""
    p = Path(data)
    return (p.parent if p.suffix in _DB_SUFFIXES else p) / TOKEN_FILE


def read_token(data: str | Path) -> str | None:
    """The token written under ``data``, or None if there is none."""
    try:
        text = token_path(data).read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def load_or_create_token(data: str | Path) -> tuple[str, Path, bool]:
    """``(token, file, created)``: the data directory's token, generated on first use with
    mode 0600. A token file that others can read or write is refused, not used."""
    path = token_path(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "tst_" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthSetupError(
                f"{path} is readable or writable by other users (mode {stat.filemode(mode)}); "
                f"run `chmod 600 {path}` or delete it to have a new token generated"
            ) from None
        existing = path.read_text().strip()
        if len(existing) < MIN_TOKEN_CHARS:
            raise AuthSetupError(
                f"{path} holds no usable token (fewer than {MIN_TOKEN_CHARS} characters); delete it"
            ) from None
        return existing, path, False
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token, path, True


def check_given_token(token: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise AuthSetupError(
            f"the trainer token must be at least {MIN_TOKEN_CHARS} characters without whitespace"
        )
    return token


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address (127.0.0.0/8, ::1).
    ``0.0.0.0``/``::`` (all interfaces), other addresses, and names that do not resolve
    are not loopback."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {i[4][0] for i in infos}
    return bool(addrs) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs
    )


def server_token(
    data: str | Path, given: str | None, no_auth: bool, host: str
) -> tuple[str | None, str]:
    """The trainer token ``turnstile serve`` runs with, and a line saying where it came from.

    The rule: authentication is always on unless ``--no-auth``; ``--no-auth`` (every route
    open, the behaviour before credentials existed) is refused unless ``host`` is a loopback
    address. With auth on, the token is ``--token``/``$TURNSTILE_TOKEN`` if given, else the
    data directory's token file (generated the first time)."""
    if no_auth:
        if not is_loopback(host):
            raise AuthSetupError(
                f"--no-auth with --host {host}: without a trainer token every route (rewards, "
                "delete, admin) would be open to the network. Bind a loopback address "
                "(127.0.0.1, ::1) or drop --no-auth"
            )
        return None, (
            "WARNING: --no-auth: every route is open to anything that can reach "
            f"{host} (a sandbox on this machine can post rewards)"
        )
    if given is None:
        given = os.environ.get(TOKEN_ENV) or None
    if given is not None:
        return check_given_token(given), "trainer token: given (--token / $TURNSTILE_TOKEN)"
    token, path, created = load_or_create_token(data)
    return token, f"trainer token: {'generated in' if created else 'read from'} {path} (0600)"
