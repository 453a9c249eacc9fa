"""A DIMSE address with the wrong AE title, against a real Orthanc that checks the called AE title and takes instances
only from the modalities it lists (as most archives are set up): the error names the AE title the archive refused, the
archive's reason, and the fix that applies (the address's AE title, or ctpipe's own ``pacs.ae_title`` when the archive
does not know it); a result sent there fails at once instead of being retried.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.errors import PacsRequestError
from pipeline.pacs.address import parse_source
from pipeline.pacs.connect import open_archive
from tests._support.orthanc import HOST, OrthancServer

pytestmark = pytest.mark.pacs
pytest_plugins = ["tests._support.orthanc"]


class _StrictOrthanc(OrthancServer):
    """Orthanc answering only to its own AE title (``DicomCheckCalledAet``, as every Orthanc the tests start) and
    storing only what the modalities it lists send (``DicomAlwaysAllowStore: false``; ctpipe's AE title CTPIPE is
    listed)."""

    def config(self) -> dict[str, Any]:
        return {**super().config(), "DicomAlwaysAllowStore": False}


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    srv = _StrictOrthanc(tmp_path_factory.mktemp("strict_orthanc")).start()
    try:
        yield srv
    finally:
        srv.stop()


#: a study date no test stores (the phantom studies are of January 2025): the query with the right AE title answers
#: with no study however many the tests sharing the archive have stored
EMPTY_DATE = "19000101"


def _cfg(**extra: Any) -> Any:
    return load_config(overrides={"pacs.timeout_s": 10.0, "pacs.retries": 2, "pacs.backoff_s": 0.05, **extra}, environ={})


def test_a_wrong_archive_ae_title_is_named_with_the_fix_for_the_address(strict):
    src = f"dimse://NOTORTHANC@{HOST}:{strict.dicom_port}?studydate={EMPTY_DATE}"
    archive = open_archive(parse_source(src).endpoint, _cfg())
    with pytest.raises(PacsRequestError) as ei:
        archive.find_studies(parse_source(src).query)
    msg = str(ei.value)
    assert f"dimse://NOTORTHANC@{HOST}:{strict.dicom_port}" in msg
    assert "Called AE title not recognised" in msg and "called AE title NOTORTHANC" in msg
    assert "'NOTORTHANC' is not the archive's AE title" in msg and "dimse://ARCHIVE_AET@" in msg
    assert "must list ctpipe's AE title" not in msg  # not the other end's configuration
    good = f"dimse://{strict.aet}@{HOST}:{strict.dicom_port}?studydate={EMPTY_DATE}"
    assert open_archive(parse_source(good).endpoint, _cfg()).find_studies(parse_source(good).query) == []


def test_results_from_an_ae_title_the_archive_does_not_list_fail_at_once_naming_it(strict, tmp_path, capsys):
    """Orthanc accepts the association of a calling AE title it does not list, then closes it at the first C-STORE
    request. The results are recorded failed after one attempt (not retried through pacs.send_retries backoffs), and
    the error names ctpipe's AE title and where to list it (was: "the destination closed the association after 0 of 2
    file(s)", retried six times over half a minute, with no AE title and no fix)."""
    from pipeline.cli import main
    from pipeline.pacs.ledger import Ledger
    from pipeline.runner.store import RunStore
    from tests.test_dicom_out_sources import phantom_case
    from tests.test_pacs_sender import _completed_case

    run = tmp_path / "run"
    uids = _completed_case(run, "c1", phantom_case(tmp_path / "case", n_nodules=1))
    RunStore(run).close()
    dest = f"dimse://{strict.aet}@{HOST}:{strict.dicom_port}"
    args = ["send", str(run), "--to", dest, "--timeout", "60", "--set", "pacs.backoff_s=5"]
    assert main([*args, "--set", "pacs.ae_title=STRANGER"]) == 3
    rows = Ledger(run).rows("SELECT state, attempts, error FROM sent")
    assert len(rows) == len(uids) and all(r["state"] == "failed" and r["attempts"] == 1 for r in rows)
    err = capsys.readouterr().err
    assert "calling AE title STRANGER" in err and "'STRANGER' (pacs.ae_title)" in err and "--retry-failed" in err
    assert not any(strict.holds(uid) for uid in uids.values())
    assert main([*args, "--retry-failed"]) == 0  # ctpipe's own AE title, which the archive lists
    assert all(strict.holds(uid) for uid in uids.values())


def test_the_orthanc_the_tests_and_benchmarks_start_refuses_a_wrong_called_ae_title(orthanc, tmp_path):
    """The Orthanc configuration the tests and scripts/bench_pacs.py start checks the called AE title
    (``DicomCheckCalledAet``), as a hospital archive does: a dimse:// address with a wrong AE title fails there with
    ctpipe's error naming the AE title and the fix (was: Orthanc's default answered any called AE title, so a wrong
    one went unnoticed until the hospital's archive refused it)."""
    from pipeline.cli import main

    assert orthanc.config()["DicomCheckCalledAet"] is True
    src = f"dimse://NOTORTHANC@{HOST}:{orthanc.dicom_port}?studydate={EMPTY_DATE}"
    with pytest.raises(PacsRequestError) as ei:
        open_archive(parse_source(src).endpoint, _cfg()).find_studies(parse_source(src).query)
    msg = str(ei.value)
    assert "called AE title NOTORTHANC" in msg and "'NOTORTHANC' is not the archive's AE title" in msg, msg
    assert "dimse://ARCHIVE_AET@" in msg, msg
    good = f"dimse://{orthanc.aet}@{HOST}:{orthanc.dicom_port}?studydate={EMPTY_DATE}"
    assert open_archive(parse_source(good).endpoint, _cfg()).find_studies(parse_source(good).query) == []
    # the same through the command line: a failure line naming the AE title and its fix, exit status 3
    assert main(["run", src, "--out", str(tmp_path / "run"), "--set", "pacs.retries=0"]) == 3
