"""--web.config.file in the Prometheus exporter-toolkit format: TLS and basic auth.

Keys this Python server cannot honour exactly (cipher_suites, curve_preferences,
client_allowed_sans, RequestClientCert, ...) are refused with an error rather
than silently ignored: a security setting that is quietly dropped is worse than none.
"""

from __future__ import annotations

import functools
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpunode_common.config import ConfigError, load_yaml

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                 "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version"}
_UNSUPPORTED_TLS_KEYS = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences",
                         "prefer_server_cipher_suites", "client_allowed_sans"}


@functools.cache
def _dummy_hash(cost: int) -> bytes:
    """Checked for unknown users at the users' own cost, so an unknown name takes as long to
    refuse as a known one: the time tells nothing of which names exist."""
    import bcrypt  # only with basic-auth users configured

    return bcrypt.hashpw(b"unknown-user", bcrypt.gensalt(cost))


def _cost(hashed: bytes) -> int:
    """The cost of "$2b$12$...": 4 to 31."""
    field = hashed[4:6]
    if not (field.isdigit() and field.isascii() and 4 <= int(field) <= 31 and hashed[6:7] == b"$"):
        raise ConfigError("not a bcrypt hash: want $2b$NN$...")
    return int(field)


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    _verified: dict[tuple[str, bytes], bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def dummy_hash(self) -> bytes:
        """What an unknown user's password is checked against: a hash at the users' own cost."""
        return _dummy_hash(max(map(_cost, self.users.values())))

    def authorized(self, user: str, password: str) -> bool:
        """bcrypt is slow by design: remember each (user, password digest) outcome."""
        if not self.users:
            return True
        import hashlib  # only with basic-auth users: _hashlib maps libcrypto (~3.7 MiB resident)

        key = (user, hashlib.sha256(password.encode()).digest())
        with self._lock:
            cached = self._verified.get(key)
        if cached is not None:
            return cached
        hashed = self.users.get(user)
        try:
            import bcrypt  # only with basic-auth users configured

            ok = bcrypt.checkpw(password.encode(), hashed or self.dummy_hash()) and hashed is not None
        except ValueError:
            ok = False
        with self._lock:
            if len(self._verified) > 1024:
                self._verified.clear()
            self._verified[key] = ok
        return ok


def _mapping(value: object, where: str) -> dict:
    """A section: absent or empty is {}; anything but a mapping of strings is an error."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{where}: want a mapping with string keys, got {type(value).__name__}")
    return value


def _string(section: dict, key: str, where: str, default: str | None = None) -> str | None:
    value = section.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: want a string, got {type(value).__name__}")
    return value


def _check_keys(section: dict, known: set[str], where: str) -> None:
    for key in section:
        if key in _UNSUPPORTED_TLS_KEYS:
            raise ConfigError(f"{where}.{key}: not supported by gpunode-exporter")
        if key not in known:
            raise ConfigError(f"unknown key '{where}.{key}'")


def _ssl_context(tls: dict, base: Path) -> ssl.SSLContext:
    _check_keys(tls, _TLS_KEYS, "tls_server_config")
    for name in _TLS_KEYS:
        _string(tls, name, "tls_server_config")
    cert, key = tls.get("cert_file"), tls.get("key_file")
    if not cert or not key:
        raise ConfigError("tls_server_config: cert_file and key_file are both required")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for name, attr, default in (("min_version", "minimum_version", "TLS12"),
                                ("max_version", "maximum_version", "TLS13")):
        value = tls.get(name, default)
        if value not in _TLS_VERSIONS:
            raise ConfigError(f"tls_server_config.{name}: unknown version {value!r}")
        setattr(ctx, attr, _TLS_VERSIONS[value])
    try:
        ctx.load_cert_chain(base / cert, base / key)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"tls_server_config: cannot load cert_file/key_file: {err}") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"tls_server_config.client_auth_type: {auth!r} not supported "
                          f"(use one of {', '.join(_CLIENT_AUTH)})")
    ctx.verify_mode = _CLIENT_AUTH[auth]
    ca = tls.get("client_ca_file")
    if ca:
        if auth == "NoClientCert":
            raise ConfigError("tls_server_config: client_ca_file set but client_auth_type is NoClientCert")
        try:
            ctx.load_verify_locations(base / ca)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"tls_server_config.client_ca_file: {err}") from None
    elif auth != "NoClientCert":
        raise ConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
    return ctx


def load(path: Path | None) -> WebConfig:
    if path is None:
        return WebConfig()
    return load_yaml(path, lambda data: _parse(data, path.parent))


def _parse(data: object, base: Path) -> WebConfig:
    data = _mapping(data, "top level")
    _check_keys(data, {"tls_server_config", "basic_auth_users", "http_server_config"}, "web")
    web = WebConfig()
    tls = _mapping(data.get("tls_server_config"), "tls_server_config")
    if tls:
        web.ssl_context = _ssl_context(tls, base)
    for user, hashed in _mapping(data.get("basic_auth_users"), "basic_auth_users").items():
        if not isinstance(hashed, str) or not hashed.isascii():
            raise ConfigError(f"basic_auth_users.{user}: want a bcrypt hash string")
        hashed = hashed.encode()
        if not hashed.startswith((b"$2a$", b"$2b$", b"$2y$")):
            raise ConfigError(f"basic_auth_users.{user}: not a bcrypt hash")
        try:
            _cost(hashed)
        except ConfigError as err:
            raise ConfigError(f"basic_auth_users.{user}: {err}") from None
        web.users[str(user)] = hashed
    if web.users:
        web.dummy_hash()  # made now, not on the first unknown user
    http = _mapping(data.get("http_server_config"), "http_server_config")
    _check_keys(http, {"headers", "http2"}, "http_server_config")
    headers = _mapping(http.get("headers"), "http_server_config.headers")
    for name, value in headers.items():
        # A header line cannot hold a line break: it would end the header (response splitting).
        if not isinstance(value, str) or any(c in name + value for c in "\r\n\0") or not name.strip():
            raise ConfigError(f"http_server_config.headers.{name!r}: want a one-line string")
    web.headers = dict(headers)
    return web

