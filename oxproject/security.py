"""Security helpers the settings use: the secret key's checks, a private local key, database
file and var/ folder for local use, and the client address behind trusted proxies.

Imported by settings before Django is set up: nothing here may touch django.conf.settings at
import time.
"""

import ipaddress
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

# Values that were ever shown as examples (ours, Django's, tutorials'): a key anyone can read
# in a repository is no secret, however long.
PLACEHOLDER_KEYS = frozenset(
    {
        "change-me-to-a-long-random-string",
        "insecure-development-key-only-for-debug",
    }
)
PLACEHOLDER_WORDS = ("change-me", "changeme", "change_me", "replace-me", "insecure", "placeholder", "your-secret")
MIN_KEY_LENGTH = 50  # Django's own security.W009 threshold
MIN_KEY_DISTINCT = 10  # a 64-digit hex key has all 16 digits; "abcde" * 10 has 5
LOCAL_KEY_FILE = "secret_key"


def key_problem(key: str) -> str | None:
    """Why `key` cannot be a production secret, or None when it can."""
    lowered = key.lower()
    if key in PLACEHOLDER_KEYS or any(word in lowered for word in PLACEHOLDER_WORDS):
        return "it is a published placeholder"
    if key.startswith("django-insecure-"):
        return "it is a key startproject generated for development (django-insecure-...)"
    if len(key) < MIN_KEY_LENGTH:
        return f"it is {len(key)} characters long; at least {MIN_KEY_LENGTH} are needed"
    if len(set(key)) < MIN_KEY_DISTINCT:
        return f"it has {len(set(key))} distinct characters; a random key has far more than {MIN_KEY_DISTINCT}"
    period = next((p for p in range(1, len(key) // 2 + 1) if key == (key[:p] * (len(key) // p + 1))[: len(key)]), 0)
    if period:
        return f"it repeats a {period}-character pattern"
    return None


def secret_key(configured: str, debug: bool, var_dir: Path) -> str:
    """The SECRET_KEY: the configured one, checked when DEBUG is off; with DEBUG on and none
    configured, a random key kept in var/ (mode 0600) so local logins survive a restart.
    There is no built-in fallback: a key in the source would let anyone sign cookies."""
    if configured:
        if not debug and (problem := key_problem(configured)):
            raise ImproperlyConfigured(
                f"DJANGO_SECRET_KEY is not a usable secret: {problem}. Generate one with"
                " python -c 'import secrets; print(secrets.token_urlsafe(50))'"
            )
        return configured
    if not debug:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off.")
    return local_key(var_dir / LOCAL_KEY_FILE)


def local_key(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    # Written aside then linked into place: two processes starting at once (./test's two legs)
    # both end up with the one key that won, never a half-written file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(50))
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


def private_dir(path: Path) -> None:
    """Create `path` for this user only (0700); an existing one of ours loses group and other
    bits, since it holds the database and the local key."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        path.chmod(0o700)


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if missing, and take group and other bits off an
    existing one. SQLite gives its -wal and -shm files the database file's mode, so making the
    database private before the first connection makes all three private."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists() and side.stat().st_uid == os.getuid() and side.stat().st_mode & 0o077:
            side.chmod(0o600)


def networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated addresses and CIDR networks, as gunicorn's --forwarded-allow-ips takes
    them ("*" is refused here: trusting everyone is trusting no proxy at all)."""
    found = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"FORWARDED_ALLOW_IPS: {item!r} is not an address or network") from exc
    return found


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, proxies: Iterable[object]) -> bool:
    return any(address in net for net in proxies)  # type: ignore[operator]


def client_ip(request: HttpRequest) -> str | None:
    """The address of whoever sent the request, for login throttling. REMOTE_ADDR, unless it is
    a configured proxy (settings.OX_TRUSTED_PROXIES, from FORWARDED_ALLOW_IPS): then the right-
    most X-Forwarded-For entry that is not one of ours. A client cannot pick its own address by
    sending X-Forwarded-For: only the proxies we trust are believed."""
    from django.conf import settings

    proxies = getattr(settings, "OX_TRUSTED_PROXIES", [])
    remote = _address(request.META.get("REMOTE_ADDR", ""))
    if remote is None:
        return None
    if not _trusted(remote, proxies):
        return str(remote)
    hops = [h for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            break  # garbage in the chain: stop at the last address a trusted proxy vouched for
        if not _trusted(address, proxies):
            return str(address)
        remote = address
    return str(remote)
