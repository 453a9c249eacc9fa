"""The privacy tests' reader finds a name wherever a file can carry it as text, and never in pixel or voxel bytes."""

from __future__ import annotations

import base64
import gzip
import io

import numpy as np
import SimpleITK as sitk
from PIL import Image, PngImagePlugin

from tests._support.leaks import file_text


def _png(text: dict[str, str] | None = None, *, compressed: bool = False) -> bytes:
    info = PngImagePlugin.PngInfo()
    for k, v in (text or {}).items():
        info.add_itxt(k, v, zip=True) if compressed else info.add_text(k, v)
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8)).save(buf, "PNG", pnginfo=info)
    return buf.getvalue()


def test_png_text_chunks_are_read_and_pixels_are_not(tmp_path):
    for compressed in (False, True):
        p = tmp_path / f"plain_{compressed}.png"
        p.write_bytes(_png({"Author": "Smith^John"}, compressed=compressed))
        assert "smith^john" in file_text(p)
    p = tmp_path / "pixels.png"
    p.write_bytes(_png())
    assert len(file_text(p)) < 100  # no text chunks: nothing of the image data is searched


def test_an_html_page_is_read_without_its_embedded_plots_but_with_their_text(tmp_path):
    plain, tagged = (base64.b64encode(_png(t)).decode() for t in (None, {"Title": "Doerr^Janette"}))
    p = tmp_path / "report.html"
    p.write_text(f'<p>Case one</p><img src="data:image/png;base64,{plain}"><img src="data:image/png;base64,{tagged}">')
    text = file_text(p)
    assert "case one" in text and "doerr^janette" in text
    assert plain.lower()[:40] not in text and tagged.lower()[:40] not in text
    p.write_text('<p>Patient Smith^John</p><img src="data:image/png;base64,' + plain + '">')
    assert "smith^john" in file_text(p)


def test_a_nifti_header_is_read_and_its_voxels_are_not(tmp_path):
    p = tmp_path / "mask.nii.gz"
    sitk.WriteImage(sitk.GetImageFromArray(np.full((8, 16, 16), 0x6A, np.uint8)), str(p))  # 0x6A is "j"
    raw = bytearray(gzip.decompress(p.read_bytes()))
    assert "jjjj" not in file_text(p)
    raw[148 : 148 + 10] = b"Smith^John"  # the descrip field
    p.write_bytes(gzip.compress(bytes(raw)))
    assert "smith^john" in file_text(p)


def test_an_npy_header_is_read_and_its_values_are_not(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.frombuffer(b"john" * 64, np.uint8))
    text = file_text(p)
    assert "shape" in text and "john" not in text
    p = tmp_path / "notes.txt"
    p.write_text("seen for John")
    assert "john" in file_text(p)
