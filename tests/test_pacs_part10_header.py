"""The Part 10 header ``ctpipe listen`` writes before each received dataset is byte for byte pynetdicom's own
(``event.encoded_dataset(include_meta=True)``), for UIDs of odd and even length and every kind of transfer syntax."""

from __future__ import annotations

import pydicom
import pytest
from pynetdicom.dsutils import create_file_meta, encode_file_meta

from pipeline.pacs.scp import part10_header


@pytest.mark.parametrize(
    "transfer_syntax",
    ["1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.5"],
)
@pytest.mark.parametrize("sop_instance", ["1.2.3.4", "1.2.3.45", "2.25.154376897419431049722134985634158236121", "9" * 64])
def test_part10_header_is_pynetdicoms(transfer_syntax, sop_instance, tmp_path):
    sop_class = "1.2.840.10008.5.1.4.1.1.2"
    meta = create_file_meta(sop_class_uid=sop_class, sop_instance_uid=sop_instance, transfer_syntax=transfer_syntax)
    expected = b"\x00" * 128 + b"DICM" + encode_file_meta(meta)
    got = part10_header(sop_class=sop_class, sop_instance=sop_instance, transfer_syntax=transfer_syntax)
    assert got == expected
    (tmp_path / "x.dcm").write_bytes(got)
    meta_read = pydicom.filereader.read_file_meta_info(tmp_path / "x.dcm")
    assert (meta_read.MediaStorageSOPInstanceUID, meta_read.TransferSyntaxUID) == (sop_instance, transfer_syntax)
