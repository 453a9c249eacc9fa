"""Credentials and HTTP sessions for DICOMweb archives.

Credentials never live in addresses or configuration files. They come from, first found:

1. the environment: ``CTPIPE_DICOMWEB_USER`` and ``CTPIPE_DICOMWEB_PASSWORD`` (both, or neither);
2. a netrc-style file (``machine HOST login USER password PASS``): ``pacs.netrc``, else ``$NETRC``,
   else ``~/.netrc``; the entry for the archive's host name is used.

Without either, requests go unauthenticated. HTTPS certificates are verified unless
``pacs.tls_verify`` is false (``pacs.ca_bundle`` names a CA file). Nothing here logs a secret.
"""

from __future__ import annotations

import logging
import netrc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PacsAddressError
from .address import Endpoint

log = logging.getLogger(__name__)

ENV_USER = "CTPIPE_DICOMWEB_USER"
ENV_PASSWORD = "CTPIPE_DICOMWEB_PASSWORD"  # noqa: S105 - the variable's name, not a secret


@dataclass(frozen=True)
class Credentials:
    """A user name and password, and where they came from (for messages; the password is never shown)."""

    user: str
    password: str
    origin: str

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password='***', origin={self.origin!r})"


def find_credentials(
    host: str, *, netrc_file: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None
) -> Credentials | None:
    """Credentials for ``host`` (see the module docstring), or None."""
    env = os.environ if environ is None else environ
    user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
    if user or password:
        if not (user and password):
            missing = ENV_PASSWORD if user else ENV_USER
            raise PacsAddressError(
                f"{missing} is not set but its partner is",
                where="environment",
                fix=f"set both {ENV_USER} and {ENV_PASSWORD}, or neither",
            )
        return Credentials(user, password, "environment")
    path = Path(netrc_file) if netrc_file else Path(env.get("NETRC") or Path.home() / ".netrc")
    if not path.is_file():
        if netrc_file:
            raise PacsAddressError(
                f"the credentials file {path} does not exist",
                where="pacs.netrc",
                fix="create it (machine HOST login USER password PASS) or set pacs.netrc to null",
            )
        return None
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError) as exc:
        raise PacsAddressError(
            f"cannot read the credentials file {path} ({type(exc).__name__})",
            where="pacs.netrc",
            fix="write lines of the form: machine HOST login USER password PASS",
        ) from exc
    if entry is None:
        return None
    login, _account, pw = entry
    if not login or pw is None:
        return None
    return Credentials(login, pw, str(path))


def http_session(endpoint: Endpoint, cfg: Any) -> Any:
    """A ``requests.Session`` for ``endpoint``: credentials attached, TLS verification as configured.

    ``cfg`` is the run's :class:`~pipeline.config.Config` (its ``pacs`` section is read).
    """
    import requests

    session = requests.Session()
    creds = find_credentials(endpoint.host, netrc_file=cfg.pacs.netrc)
    if creds is not None:
        session.auth = (creds.user, creds.password)
        log.debug("DICOMweb %s: credentials of user %s from %s", endpoint.redacted(), creds.user, creds.origin)
    session.trust_env = False  # no proxies or ~/.netrc lookups behind our back
    if endpoint.url.startswith("https://"):
        if not cfg.pacs.tls_verify:
            log.warning("DICOMweb %s: TLS certificate verification is off (pacs.tls_verify: false)", endpoint.redacted())
            session.verify = False
        elif cfg.pacs.ca_bundle:
            session.verify = str(cfg.pacs.ca_bundle)
        else:
            session.verify = True
    return session
