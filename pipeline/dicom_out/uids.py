"""Deterministic UIDs: the same inputs give the same UID, so objects written apart refer to one another alike."""

from __future__ import annotations

import hashlib


def stable_uid(*parts: str) -> str:
    """A ``2.25.<integer>`` UID (PS3.5 §B.2) from the SHA-256 digest of ``parts``, 128 bits."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return f"2.25.{int.from_bytes(digest[:16], 'big')}"
