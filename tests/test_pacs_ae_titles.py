"""A DIMSE address with the wrong AE title, against a real Orthanc that checks the called AE title (as most archives
are set up): the error names the AE title the archive refused, the archive's reason, and the fix that applies (the
address's AE title, not ctpipe's own ``pacs.ae_title``); a result sent there fails at once instead of being retried.
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


class _StrictOrthanc(OrthancServer):
    """Orthanc answering only to its own AE title (``DicomCheckCalledAet``)."""

    def config(self) -> dict[str, Any]:
        return {**super().config(), "DicomCheckCalledAet": True}


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    srv = _StrictOrthanc(tmp_path_factory.mktemp("strict_orthanc")).start()
    try:
        yield srv
    finally:
        srv.stop()


def _cfg(**extra: Any) -> Any:
    return load_config(overrides={"pacs.timeout_s": 10.0, "pacs.retries": 2, "pacs.backoff_s": 0.05, **extra}, environ={})


def test_a_wrong_archive_ae_title_is_named_with_the_fix_for_the_address(strict):
    src = f"dimse://NOTORTHANC@{HOST}:{strict.dicom_port}?studydate=20250102"
    archive = open_archive(parse_source(src).endpoint, _cfg())
    with pytest.raises(PacsRequestError) as ei:
        archive.find_studies(parse_source(src).query)
    msg = str(ei.value)
    assert f"dimse://NOTORTHANC@{HOST}:{strict.dicom_port}" in msg
    assert "Called AE title not recognised" in msg and "called AE title NOTORTHANC" in msg
    assert "'NOTORTHANC' is not the archive's AE title" in msg and "dimse://ARCHIVE_AET@" in msg
    assert "must list ctpipe's AE title" not in msg  # not the other end's configuration
    good = f"dimse://{strict.aet}@{HOST}:{strict.dicom_port}?studydate=20250102"
    assert open_archive(parse_source(good).endpoint, _cfg()).find_studies(parse_source(good).query) == []
