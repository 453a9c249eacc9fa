"""The UIDs ``ctpipe listen`` files a received instance under, read from the encoded dataset without decoding it
(:mod:`pipeline.pacs.listener_uids`), agree with pynetdicom's full decode (``event.dataset``) in every transfer
syntax the listener accepts, sequences of defined and undefined length before the UIDs included; what the scan
cannot be sure of is left to the full decode (None)."""

from __future__ import annotations

import io
import zlib

import pytest
from pydicom import Dataset
from pydicom.filewriter import write_dataset
from pydicom.sequence import Sequence
from pynetdicom import ALL_TRANSFER_SYNTAXES
from pynetdicom.dsutils import decode

from pipeline.pacs.listener_uids import read_uids

IMPLICIT, EXPLICIT, DEFLATED, BIG = "1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.2"


def _dataset(*, with_sequences: bool) -> Dataset:
    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    ds.SOPInstanceUID = "1.2.3.4.5.6.7"  # odd length: padded with NUL
    ds.StudyDate = "20260101"
    ds.Modality = "CT"
    if with_sequences:
        inner = Dataset()
        inner.CodeValue = "T-28000"
        inner.CodingSchemeDesignator = "SRT"
        inner.SeriesInstanceUID = "9.9.9.9"  # inside an item: not the instance's
        item = Dataset()
        item.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
        item.ReferencedSOPInstanceUID = "8.8.8.8"
        item.AnatomicRegionSequence = Sequence([inner])
        ds.ReferencedImageSequence = Sequence([item, Dataset()])
        ds.InstitutionCodeSequence = Sequence([])
    ds.PatientName = "Test^Patient"
    ds.StudyInstanceUID = "1.2.840.113619.2.55.3.1"
    ds.SeriesInstanceUID = "1.2.840.113619.2.55.3.22"
    ds.InstanceNumber = 3
    ds.BitsAllocated = 16
    ds.PixelData = b"\x00\x01" * 64
    return ds


def _encode(ds: Dataset, syntax: str, *, undefined: bool) -> bytes:
    implicit, little = syntax == IMPLICIT, syntax != BIG
    ds = ds.copy()
    if undefined:
        for elem in ds.iterall():
            if elem.VR == "SQ":
                elem.is_undefined_length = True
                for item in elem.value:
                    item.is_undefined_length_sequence_item = True
    buf = io.BytesIO()
    from pydicom.filebase import DicomFileLike

    fp = DicomFileLike(buf)
    fp.is_little_endian, fp.is_implicit_VR = little, implicit
    write_dataset(fp, ds)
    raw = buf.getvalue()
    if syntax == DEFLATED:
        co = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS)
        raw = co.compress(raw) + co.flush()
    return raw


def _full_decode(raw: bytes, syntax: str) -> dict[str, str | None]:
    ds = decode(io.BytesIO(raw), syntax == IMPLICIT, syntax != BIG, syntax == DEFLATED)
    return {
        "sop_class": ds.get("SOPClassUID"),
        "sop_uid": ds.get("SOPInstanceUID"),
        "study_uid": ds.get("StudyInstanceUID"),
        "series_uid": ds.get("SeriesInstanceUID"),
    }


@pytest.mark.parametrize("syntax", [str(s) for s in ALL_TRANSFER_SYNTAXES])
@pytest.mark.parametrize("with_sequences", [False, True])
@pytest.mark.parametrize("undefined", [False, True])
def test_uids_read_without_decoding_match_the_full_decode_in_every_accepted_syntax(syntax, with_sequences, undefined):
    raw = _encode(_dataset(with_sequences=with_sequences), syntax, undefined=undefined)
    got = read_uids(raw, syntax)
    assert got == _full_decode(raw, syntax)
    assert got == {
        "sop_class": "1.2.840.10008.5.1.4.1.1.2",
        "sop_uid": "1.2.3.4.5.6.7",
        "study_uid": "1.2.840.113619.2.55.3.1",
        "series_uid": "1.2.840.113619.2.55.3.22",
    }


def test_a_deflated_dataset_whose_uids_lie_beyond_the_inflated_start_is_left_to_the_full_decode():
    ds = _dataset(with_sequences=False)
    ds.add_new(0x00090010, "LO", "ACME")
    ds.add_new(0x00091001, "OB", bytes(range(256)) * 400)  # a private element before the UIDs, 100 kB
    raw = _encode(ds, DEFLATED, undefined=False)
    assert read_uids(raw, DEFLATED) is None
    assert read_uids(_encode(ds, EXPLICIT, undefined=False), EXPLICIT) == _full_decode(
        _encode(ds, EXPLICIT, undefined=False), EXPLICIT
    )


def test_what_the_scan_cannot_be_sure_of_is_left_to_the_full_decode():
    raw = _encode(_dataset(with_sequences=True), EXPLICIT, undefined=False)
    assert read_uids(raw[:40], EXPLICIT) is None  # cut short before the UIDs
    assert read_uids(raw, "1.2.3.4") is None  # a transfer syntax the scan does not know
    # the first two elements in the wrong order
    first_len = 8 + int.from_bytes(raw[6:8], "little")
    second_len = 8 + int.from_bytes(raw[first_len + 6 : first_len + 8], "little")
    swapped = raw[first_len : first_len + second_len] + raw[:first_len] + raw[first_len + second_len :]
    assert read_uids(swapped, EXPLICIT) is None
    # a UN element of undefined length (a sequence in Implicit VR inside) before the UIDs
    assert read_uids(b"\x09\x00\x10\x10UN\x00\x00\xff\xff\xff\xff\xfe\xff\xdd\xe0\x00\x00\x00\x00", EXPLICIT) is None


def test_a_dataset_without_series_uid_says_so():
    ds = _dataset(with_sequences=False)
    del ds.SeriesInstanceUID
    got = read_uids(_encode(ds, EXPLICIT, undefined=False), EXPLICIT)
    assert got is not None and got["series_uid"] is None
