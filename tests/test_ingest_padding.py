"""PixelPaddingValue (0028,0120) and PixelPaddingRangeLimit (0028,0121): padding pixels become air in HU.

The pixels outside the reconstruction circle hold a padding value (GE: 63536 unsigned or -2000 signed); ingest
sets them to PADDING_HU (-1024) instead of rescaling them to +62512 or -3024 HU. Malformed padding attributes are
ignored with a warning naming the file.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import DeflatedExplicitVRLittleEndian

from pipeline.cache import CaseCache
from pipeline.errors import CacheError
from pipeline.ingest import ingest_to_cache, load_series
from pipeline.ingest.discover import read_header
from pipeline.ingest.padding import PADDING_HU, pixel_padding
from tests._support.dicom import hu_pattern, write_enhanced, write_series

N, ROWS, COLS = 10, 16, 20  # 10 slices: ingest.min_slices, so no short-series warning


def _ring() -> np.ndarray:
    """Pixels outside a circle inscribed in the slice (True: padding), like a scanner's reconstruction circle."""
    j, i = np.mgrid[:ROWS, :COLS]
    return (j - (ROWS - 1) / 2) ** 2 / (ROWS / 2) ** 2 + (i - (COLS - 1) / 2) ** 2 / (COLS / 2) ** 2 > 1


def _pad(values: dict[tuple[int, int], int] | None = None, *, ring_value: int | None = None, tags=()):
    """A write_series tweak that puts padding stored values into each slice and adds the padding attributes.

    ``ring_value``: stored value of every ring pixel; ``values``: stored values of single pixels (j, i);
    ``tags``: (tag, VR, value) elements to add.
    """
    ring = _ring()

    def tweak(_k: int, ds: Dataset) -> None:
        dtype = np.int16 if ds.PixelRepresentation == 1 else np.uint16
        arr = np.frombuffer(ds.PixelData, dtype=dtype).reshape(ds.Rows, ds.Columns).copy()
        if ring_value is not None:
            arr[ring] = ring_value
        for (j, i), v in (values or {}).items():
            arr[j, i] = v
        ds.PixelData = arr.tobytes()
        for tag, vr, value in tags:
            ds.add_new(tag, vr, value)

    return tweak


def test_unsigned_padding_63536_is_air_not_bright_ring(tmp_path, caplog):
    hu = hu_pattern(N, ROWS, COLS)
    tweak = _pad(ring_value=63536, tags=[(0x00280120, "US", 63536)])
    write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, unsigned=True, tweak=tweak)
    with caplog.at_level(logging.INFO, logger="pipeline.ingest"):
        vol = load_series(tmp_path / "s")
    ring = np.broadcast_to(_ring(), hu.shape)
    assert PADDING_HU == -1024
    assert np.all(vol.array[ring] == PADDING_HU)  # not 63536 - 1024 = 62512
    assert np.array_equal(vol.array[~ring], hu[~ring])
    assert vol.array.dtype == np.int16  # the padding does not push the series to float32
    assert vol.metadata["PaddingPixels"] == int(ring.sum())
    logged = [r.getMessage() for r in caplog.records if "pixels are padding" in r.getMessage()]
    assert len(logged) == 1 and f"{int(ring.sum())} of {hu.size} pixels" in logged[0], logged


def test_signed_padding_minus_2000_implicit_vr(tmp_path):
    """Implicit VR: the value's bytes carry no VR; PixelRepresentation 1 makes them -2000, not 63536."""
    hu = hu_pattern(N, ROWS, COLS, seed=2)
    tweak = _pad(ring_value=-2000, tags=[(0x00280120, "SS", -2000)])
    write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, implicit=True, tweak=tweak)
    vol = load_series(tmp_path / "s")
    ring = np.broadcast_to(_ring(), hu.shape)
    assert np.all(vol.array[ring] == PADDING_HU)  # not -3024
    assert np.array_equal(vol.array[~ring], hu[~ring]) and vol.array.dtype == np.int16


def test_padding_range_limit_is_inclusive(tmp_path):
    hu = hu_pattern(N, ROWS, COLS, seed=3)
    # stored -2000..-1500 are padding (inclusive); -1499 (HU -2523) and -2001 (HU -3025) are image values
    pixels = {(0, 0): -2000, (0, 1): -1750, (0, 2): -1500, (0, 3): -1499, (0, 4): -2001}
    tweak = _pad(pixels, tags=[(0x00280120, "SS", -1500), (0x00280121, "SS", -2000)])
    write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, tweak=tweak)
    vol = load_series(tmp_path / "s")
    assert np.all(vol.array[:, 0, :3] == PADDING_HU)
    assert np.all(vol.array[:, 0, 3] == -1499 - 1024) and np.all(vol.array[:, 0, 4] == -2001 - 1024)
    assert np.array_equal(vol.array[:, 1:], hu[:, 1:]) and np.array_equal(vol.array[:, 0, 5:], hu[:, 0, 5:])
    assert vol.metadata["PaddingPixels"] == 3 * N


def test_no_padding_attribute_leaves_values_alone(tmp_path, caplog):
    hu = hu_pattern(N, ROWS, COLS)
    write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, tweak=_pad({(0, 0): -2000}))
    with caplog.at_level(logging.INFO, logger="pipeline.ingest"):
        vol = load_series(tmp_path / "s")
    assert vol.array[0, 0, 0] == -2000 - 1024  # without the attribute a stored value is an image value
    assert np.array_equal(vol.array[:, 1:], hu[:, 1:])
    assert "PaddingPixels" not in vol.metadata and "warnings" not in vol.metadata
    assert not [r for r in caplog.records if "pixels are padding" in r.getMessage()]


def test_padding_equal_to_air_changes_nothing(tmp_path):
    """Padding 0 with intercept -1024 is -1024 HU anyway: the volume is that of the same series without it."""
    hu = hu_pattern(N, ROWS, COLS)
    hu[:, 0, :4] = -1024
    write_series(tmp_path / "a", n=N, rows=ROWS, cols=COLS, hu=hu, unsigned=True, series_uid="1.2.3.1")
    tweak = _pad(tags=[(0x00280120, "US", 0)])
    write_series(tmp_path / "b", n=N, rows=ROWS, cols=COLS, hu=hu, unsigned=True, series_uid="1.2.3.2", tweak=tweak)
    plain, padded = load_series(tmp_path / "a"), load_series(tmp_path / "b")
    assert np.array_equal(plain.array, padded.array) and plain.array.dtype == padded.array.dtype == np.int16
    assert padded.metadata["PaddingPixels"] == 4 * N


@pytest.mark.parametrize(
    ("tags", "why"),
    [
        ([(0x00280120, "LO", "AIR")], "not a number"),  # explicit VR text where a number belongs
        ([(0x00280120, "OB", b"\x30\xf8\x30\xf8")], "2 values"),  # two values where one belongs
        ([(0x00280120, "US", 63536), (0x00280101, "US", 12)], "outside"),  # beyond 12-bit stored values
        ([(0x00280121, "US", 63536)], "without PixelPaddingValue"),
    ],
    ids=["text", "two-values", "out-of-range", "limit-alone"],
)
def test_malformed_padding_is_ignored_with_a_warning(tmp_path, caplog, tags, why):
    hu = hu_pattern(N, ROWS, COLS)
    paths = write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, unsigned=True, tweak=_pad(tags=tags))
    with caplog.at_level(logging.WARNING, logger="pipeline.ingest"):
        vol = load_series(tmp_path / "s")
    assert np.array_equal(vol.array, hu)  # the pixels are taken as they are
    warned = [w for w in vol.metadata.get("warnings", []) if "Padding" in w]
    assert len(warned) == 1 and why in warned[0] and paths[0].name in warned[0], vol.metadata.get("warnings")
    assert any(paths[0].name in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_enhanced_multiframe_padding(tmp_path):
    hu = hu_pattern(N, ROWS, COLS, seed=3)
    path, hu = write_enhanced(tmp_path / "mf" / "IMG0001", n=N, rows=ROWS, cols=COLS, hu=hu)
    ds = pydicom.dcmread(path)
    stored = np.frombuffer(ds.PixelData, dtype=np.int16).reshape(N, ROWS, COLS).copy()
    ring = _ring()
    stored[:, ring] = -2000
    ds.PixelData = stored.tobytes()
    ds.add_new(0x00280120, "SS", -2000)
    ds.save_as(path, enforce_file_format=True)
    vol = load_series(path)
    assert np.all(vol.array[:, ring] == PADDING_HU) and np.array_equal(vol.array[:, ~ring], hu[:, ~ring])
    assert vol.metadata["PaddingPixels"] == int(ring.sum()) * N


@pytest.mark.parametrize(
    ("old", "lacks"), [("ctpipe-case/1", "pixel padding"), ("ctpipe-case/2", "BitsStored")], ids=["padding", "bits_stored"]
)
def test_cache_refuses_entries_of_earlier_formats(tmp_path, old, lacks):
    """Entries written by an ingest that computed other HU values from the same files (padding kept as HU; every slice
    read with the first slice's BitsStored) are refused, saying what they lack and to ingest again."""
    hu = hu_pattern(N, ROWS, COLS)
    write_series(tmp_path / "s", n=N, rows=ROWS, cols=COLS, hu=hu, series_uid="1.2.3.9")
    cache = CaseCache(tmp_path / "cache")
    ingest_to_cache(tmp_path / "s", cache)
    assert np.array_equal(cache.read("1.2.3.9").array, hu)
    sidecar = cache.sidecar_path("1.2.3.9")
    doc = json.loads(sidecar.read_text())
    doc["format"] = old
    sidecar.write_text(json.dumps(doc))
    with pytest.raises(CacheError) as err:
        cache.read("1.2.3.9")
    assert old in str(err.value) and lacks in str(err.value) and "ingest" in err.value.fix


def test_padding_read_through_pydicom_for_deflated_files(tmp_path):
    """The pydicom fallback of the header scan (deflated, big-endian files) reads the padding too."""
    paths = write_series(tmp_path / "s", n=2, tweak=_pad(tags=[(0x00280120, "SS", -2000)]))
    ds = pydicom.dcmread(paths[0])
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(tmp_path / "deflated.dcm", enforce_file_format=True)
    h = read_header(tmp_path / "deflated.dcm")
    assert h.use_pydicom and h.padding == (-2000, -2000) and h.padding_error is None
    assert read_header(paths[0]).padding == (-2000, -2000)  # the raw parser agrees


@pytest.mark.parametrize(
    ("value", "limit", "signed", "bits", "expected"),
    [
        (63536, None, True, 16, (-2000, -2000)),  # a US value in a signed image: read as SS
        (-2000, None, False, 16, (63536, 63536)),  # and the other way round
        (("", b"\x30\xf8"), None, True, 16, (-2000, -2000)),  # implicit VR bytes: PixelRepresentation decides
        (("", b"\x30\xf8"), None, False, 16, (63536, 63536)),
        (("US", b"\x00\x00"), ("US", b"\xff\x00"), False, 16, (0, 255)),
        (("SS", b"\x30\xf8"), ("SS", b"\x00\xfa"), True, 16, (-2000, -1536)),  # inclusive, in either order
        ("-2000", None, True, 12, (-2000, -2000)),  # text (a wrong VR) that is a number
        (None, None, True, 16, None),
    ],
)
def test_pixel_padding_values(value, limit, signed, bits, expected):
    assert pixel_padding(value, limit, signed=signed, bits_stored=bits, bits_allocated=16) == (expected, None)


def test_pixel_padding_bad_limit_keeps_the_value():
    rng, why = pixel_padding(("SS", b"\x30\xf8"), ("LO", b"lots"), signed=True, bits_stored=16, bits_allocated=16)
    assert rng == (-2000, -2000) and why is not None and "PixelPaddingRangeLimit" in why and "not a number" in why
