"""Damaged and unusual DICOM inputs for the ingest tests, built from small phantoms.

Each builder writes real files (phantom series from :mod:`pipeline.phantom`, edited with
pydicom, or raw bytes) into a folder and returns what it wrote; nothing is mocked except
where a test injects a read failure explicitly (:func:`fail_reads_of`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset

from pipeline.phantom import generate_phantom
from pipeline.phantom.dicom_writer import write_dicom_series

MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"


def phantom_volume(seed: int = 1, *, slices: int = 12, matrix: int = 64):
    """A small synthetic chest CT volume (HU, LPS geometry) without nodules."""
    return generate_phantom(seed, matrix=matrix, slices=slices, n_nodules=0).volume


def write_phantom(folder: Path, *, seed: int = 1, slices: int = 12, keep: int | None = None, **options: Any) -> list[Path]:
    """A phantom CT series of ``slices`` 64×64 slices in ``folder``; returns its files sorted by name.

    ``keep``: keep only the first ``keep`` files (consecutive slices), for series shorter than the
    phantom generator makes. ``options`` go to :func:`pipeline.phantom.dicom_writer.write_dicom_series`
    (transfer_syntax, seed, ...).
    """
    write_dicom_series(phantom_volume(seed, slices=slices), folder, **options)
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    if keep is not None:
        for p in paths[keep:]:
            p.unlink()
        paths = paths[:keep]
    return paths


def edit(paths: Iterable[Path], change: Callable[[Dataset], None]) -> None:
    """Read each file with pydicom, apply ``change`` and save it back (same transfer syntax)."""
    for p in paths:
        ds = pydicom.dcmread(p)
        change(ds)
        ds.save_as(p, enforce_file_format=True)


def delete_tags(paths: Iterable[Path], *keywords: str) -> None:
    """Remove ``keywords`` (data set and file meta) from every file."""

    def change(ds: Dataset) -> None:
        for kw in keywords:
            if kw in ds:
                delattr(ds, kw)
            if kw in ds.file_meta:
                delattr(ds.file_meta, kw)

    edit(paths, change)


def set_values(paths: Iterable[Path], **values: Any) -> None:
    """Set data set elements on every file (e.g. ``RescaleSlope="NaN"``)."""

    def change(ds: Dataset) -> None:
        for kw, v in values.items():
            setattr(ds, kw, v)

    edit(paths, change)


def set_text(paths: Iterable[Path], tag: int, text: str) -> None:
    """Store ``text`` in element ``tag`` as a long string (LO), whatever the tag's own VR: for values
    pydicom refuses to write in their VR, such as a RescaleSlope of 'abc'."""

    def change(ds: Dataset) -> None:
        if tag in ds:
            del ds[tag]
        ds.add_new(tag, "LO", text)

    edit(paths, change)


def stored_pixels(path: Path) -> np.ndarray:
    """The stored values of one single-frame file."""
    return pydicom.dcmread(path).pixel_array


def truncated_copy(src: Path, dst: Path, keep: int = 300) -> Path:
    """The first ``keep`` bytes of ``src`` (a header cut short)."""
    dst.write_bytes(src.read_bytes()[:keep])
    return dst


def junk_files(folder: Path, *, seed: int = 0) -> dict[str, Path]:
    """An empty file, random bytes and a text file in ``folder`` (by kind)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    empty = folder / "empty.dcm"
    empty.write_bytes(b"")
    noise = folder / "noise.bin"
    noise.write_bytes(b"\xff" + rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())
    text = folder / "notes.txt"
    text.write_text("exported from PACS on request\n" * 20)
    return {"empty": empty, "random": noise, "text": text}


def symlink_loop(folder: Path) -> tuple[Path, Path]:
    """A link that points at itself and a link to the folder's parent (a loop through folders)."""
    folder.mkdir(parents=True, exist_ok=True)
    self_loop = folder / "loop.dcm"
    os.symlink(self_loop.name, self_loop)
    up = folder / "up"
    os.symlink("..", up)
    return self_loop, up


def running_as_root() -> bool:
    """True for root, whom ``chmod 000`` does not stop from reading a file."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


@contextmanager
def fail_reads_of(paths: Iterable[Path], error: type[OSError] = PermissionError) -> Iterator[None]:
    """Inside the block, opening ``paths`` in ingest's header and pixel readers fails with ``error``.

    For users, such as root, whom ``chmod 000`` does not stop. Only the named files fail;
    every other open goes to the real :func:`open`.
    """
    import builtins

    import pipeline.ingest.pixels as pixels
    import pipeline.ingest.rawheader as rawheader

    blocked = {os.path.abspath(p) for p in paths}
    real_open = builtins.open
    code = 13 if issubclass(error, PermissionError) else 2

    def guarded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) in blocked:
            raise error(code, os.strerror(code), str(file))
        return real_open(file, *args, **kwargs)

    modules = (rawheader, pixels)
    for m in modules:
        m.open = guarded_open  # type: ignore[attr-defined]  # found before the builtin by the module's own code
    try:
        yield
    finally:
        for m in modules:
            del m.open  # type: ignore[attr-defined]


#: compressed phantoms :func:`write_compressed_phantom` writes: name -> transfer syntax UID
COMPRESSED = {
    "rle": pydicom.uid.RLELossless,
    "jpeg2000": pydicom.uid.JPEG2000Lossless,
    "jpegls": pydicom.uid.JPEGLSLossless,
    "jpeg_lossless": pydicom.uid.JPEGLosslessSV1,
}


def compress_files(paths: Iterable[Path], syntax: str, *, fragment_kb: int | None = None) -> None:
    """Compress ``paths`` in place as ``syntax`` (a key of :data:`COMPRESSED`): JPEG Lossless SV1 by dcmtk's
    ``dcmcjpeg +e1`` (the test skips when dcmtk is not installed; ``fragment_kb``: each frame split into fragments
    of that many KiB), the others by pydicom's encoders (CharLS, OpenJPEG, its RLE encoder)."""
    import shutil
    import subprocess

    for p in paths:
        if syntax != "jpeg_lossless":
            ds = pydicom.dcmread(p)
            ds.compress(COMPRESSED[syntax])
            ds.save_as(p)
            continue
        if shutil.which("dcmcjpeg") is None:
            import pytest

            pytest.skip("dcmcjpeg (dcmtk) not installed: it writes the JPEG Lossless files")
        fragments = ["+fs", str(fragment_kb)] if fragment_kb else []
        subprocess.run(["dcmcjpeg", "+e1", *fragments, str(p), str(p)], check=True, capture_output=True, timeout=60)


def write_compressed_phantom(folder: Path, syntax: str, *, seed: int = 1, fragment_kb: int | None = None) -> list[Path]:
    """A 12-slice phantom series in ``folder`` compressed as ``syntax`` (a key of :data:`COMPRESSED`): RLE and JPEG
    2000 by the phantom writer, the others by :func:`compress_files`. Returns the files sorted by name."""
    if syntax in ("rle", "jpeg2000"):
        return write_phantom(folder, seed=seed, transfer_syntax=syntax)
    paths = write_phantom(folder, seed=seed)
    compress_files(paths, syntax, fragment_kb=fragment_kb)
    return paths


def frame_bytes(path: Path) -> bytes:
    """The compressed frame of a single-frame file (its fragments joined)."""
    from pydicom.encaps import generate_frames

    return next(generate_frames(pydicom.dcmread(path).PixelData, number_of_frames=1))


def replace_frame(path: Path, change: Callable[[bytes], bytes]) -> None:
    """Store ``change(frame)`` as the file's single fragment, with correct item lengths and sequence delimiter (the
    way a naive tool rewrites a damaged file): only the codestream is damaged, not its encapsulation."""
    from pydicom.encaps import encapsulate

    new = change(frame_bytes(path))
    ds = pydicom.dcmread(path)
    ds.PixelData = encapsulate([new + b"\x00" * (len(new) % 2)])
    ds.save_as(path, enforce_file_format=True)
