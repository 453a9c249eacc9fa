"""Why ``ctpipe listen`` rejected an association, in its log: a calling AE title not allowed, a called AE title not its
own, or one association more than it takes at once (a router or modality sending in parallel), each with the fix.
Real senders: pynetdicom's association requests."""

from __future__ import annotations

import logging
import time

import pytest

from tests._support.orthanc import HOST
from tests.test_pacs_listen_receive import AET, _listener

pytestmark = pytest.mark.pacs


def _associate(port: int, *, calling: str = "MODALITY", called: str = AET) -> tuple[object, object]:
    from pynetdicom import AE

    ae = AE(ae_title=calling)
    ae.add_requested_context("1.2.840.10008.1.1")  # Verification
    return ae, ae.associate(HOST, port, ae_title=called)


def _rejections(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The listener's rejection warnings, once one is there (logged by the association's thread just after its
    answer went out, so polled for up to 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        said = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_rejected"]
        if said or time.monotonic() > deadline:
            return said
        time.sleep(0.02)


def test_one_association_more_than_the_listener_takes_is_said_so_with_the_fix(tmp_path, caplog):
    """17 senders' associations open at once: the 17th is rejected (transient), and the warning says that the listener
    had as many as it takes open, and what the senders can do (was: "the association request was not acceptable;
    fix: see the sender's log", which the sender's log does not explain)."""
    opened = []
    with caplog.at_level(logging.WARNING, logger="pipeline.pacs.listener"), _listener(tmp_path / "run") as lst:
        try:
            limit = 16
            for _ in range(limit):
                opened.append(_associate(lst.port))
            assert all(assoc.is_established for _, assoc in opened)  # type: ignore[attr-defined]
            ae, extra = _associate(lst.port)
            opened.append((ae, extra))
            assert extra.is_rejected, "the listener took more associations than it says"  # type: ignore[attr-defined]
            rejected = _rejections(caplog)
        finally:
            for ae, assoc in opened:
                if assoc.is_established:  # type: ignore[attr-defined]
                    assoc.release()  # type: ignore[attr-defined]
                ae.shutdown()  # type: ignore[attr-defined]
    (said,) = rejected
    assert f"{limit} associations were open already" in said and "transient" in said, said
    assert f"open at most {limit} associations at once" in said, said


@pytest.mark.parametrize(
    "calling,called,expected",
    [
        ("INTRUDER", AET, "calling AE title 'INTRUDER' is not among pacs.allowed_aets (MODALITY)"),
        ("MODALITY", "WRONG", f"called AE title 'WRONG' is not this listener's '{AET}'"),
    ],
)
def test_a_rejected_ae_title_is_named_with_the_fix(tmp_path, caplog, calling, called, expected):
    with caplog.at_level(logging.WARNING, logger="pipeline.pacs.listener"), _listener(tmp_path / "run") as lst:
        ae, assoc = _associate(lst.port, calling=calling, called=called)
        try:
            assert assoc.is_rejected  # type: ignore[attr-defined]
            rejected = _rejections(caplog)
        finally:
            ae.shutdown()  # type: ignore[attr-defined]
    (said,) = rejected
    assert expected in said and "fix:" in said, said
