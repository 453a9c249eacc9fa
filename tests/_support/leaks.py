"""The text a file can carry, for the tests that look for patient names and numbers in a command's outputs.

Compressed or pixel payloads (a PNG's image data, a NIfTI's voxels, a report's embedded plots) are bytes that spell a
short name such as "john" by chance in about one run in ten: searching them makes a privacy test fail at random. What
a file can say about a patient is in its name and in its text: a PNG's text chunks, a NIfTI header and its
extensions, an .npy header, and everything of a text file outside its base64 data URIs (whose PNGs are read the same
way)."""

from __future__ import annotations

import base64
import gzip
import io
import re
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

_DATA_URI = re.compile(rb"data:image/png;base64,([A-Za-z0-9+/=]+)")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_text(data: bytes) -> bytes:
    """The keywords and text of a PNG's tEXt, zTXt and iTXt chunks (the only place a PNG carries text)."""
    if not data.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG: its first 8 bytes are not the PNG signature")
    out, pos = [], len(_PNG_SIGNATURE)
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt":
            out.append(body)
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out += [key, zlib.decompress(rest[1:])]
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            lang, _, rest = rest.partition(b"\0")
            translated, _, text = rest.partition(b"\0")
            out += [key, lang, translated, zlib.decompress(text) if compressed else text]
        pos += 12 + length
    return b"\n".join(out)


def _nifti_text(data: bytes) -> bytes:
    """A NIfTI-1 file's header and extensions (descrip, aux_file, intent_name and any extension text), not its voxels."""
    (vox_offset,) = struct.unpack("<f", data[108:112])
    return data[: max(348, int(vox_offset))]


def _npy_text(data: bytes) -> bytes:
    """An .npy file's header (dtype, shape, order), not its values."""
    buf = io.BytesIO(data)
    version = np.lib.format.read_magic(buf)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    read(buf)  # moves to the data
    return data[: buf.tell()]


def file_text(path: Path) -> str:
    """Everything in ``path`` that can carry a name as text, lower-cased (latin-1, so any byte reads)."""
    data = path.read_bytes()
    name = path.name.lower()
    if name.endswith(".gz"):
        data, name = gzip.decompress(data), name[:-3]
    if name.endswith(".png"):
        text = png_text(data)
    elif name.endswith(".nii"):
        text = _nifti_text(data)
    elif name.endswith(".npy"):
        text = _npy_text(data)
    elif name.endswith(".npz"):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            text = b"\n".join(n.encode() + b"\n" + _npy_text(z.read(n)) for n in z.namelist())
    else:
        uris = [base64.b64decode(m.group(1)) for m in _DATA_URI.finditer(data)]
        text = _DATA_URI.sub(b"data:image/png;base64,", data) + b"\n".join(png_text(u) for u in uris)
    return text.decode("latin-1").lower()
