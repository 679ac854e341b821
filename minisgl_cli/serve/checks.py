"""The server's own options, checked before anything slow: a mistake is one line and exit 2, before the port is
bound or the model loads."""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import urlsplit

import typer


def check_api_key(key: str | None) -> None:
    if key is not None and (not key or any(c.isspace() for c in key)):
        raise typer.BadParameter("a key is one or more characters without spaces", param_hint="'--api-key'")


def check_origins(origins: list[str]) -> None:
    for origin in origins:
        if not is_origin(origin):
            raise typer.BadParameter(f"{origin!r} is not an origin: give scheme://host[:port] with no path "
                                     f"(as a browser sends it), or *", param_hint="'--allow-origin'")


def is_origin(text: str) -> bool:
    """``*``, or an origin as a browser's Origin header gives it: scheme://host[:port], nothing after."""
    if text == "*":
        return True
    parts = urlsplit(text)
    try:
        port = parts.port  # a port past 65535 or not a number is an error here
    except ValueError:
        return False
    return (bool(parts.scheme) and bool(parts.hostname) and "@" not in parts.netloc and port != 0
            and text == f"{parts.scheme}://{parts.netloc}")


def check_tls(certfile: Path | None, keyfile: Path | None) -> None:
    """Both files or neither, and they load as a certificate and its key: checked before the model loads."""
    if (certfile is None) != (keyfile is None):
        given, missing = ("--ssl-certfile", "--ssl-keyfile") if keyfile is None else ("--ssl-keyfile",
                                                                                     "--ssl-certfile")
        raise typer.BadParameter(f"it needs {missing} too", param_hint=f"'{given}'")
    if certfile is None:
        return
    for option, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=f"'{option}'")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:  # OpenSSL's own words name a C source line; say what is wrong instead
        why = ("the key is not this certificate's" if exc.reason == "KEY_VALUES_MISMATCH" else
               "they are not a PEM certificate and its unencrypted PEM key")
        raise typer.BadParameter(f"cannot load {certfile} with {keyfile}: {why}", param_hint="'--ssl-certfile'") \
            from None
    except OSError as exc:  # a file that cannot be read
        raise typer.BadParameter(f"cannot read {certfile} or {keyfile}: {exc.strerror or exc}",
                                 param_hint="'--ssl-certfile'") from None
