"""What the ingest modules share about pydicom: the exceptions it raises on damaged files and the
transfer-syntax checks made before it decodes pixel data.

pydicom is imported inside the functions that use it, on purpose: importing it takes a few hundred
milliseconds, and most files never need it (the raw header parser and the direct pixel reads handle
uncompressed little-endian data), so ``import pipeline.ingest`` and ``ctpipe --help`` stay fast.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import UnsupportedTransferSyntaxError
from .rawheader import DEFLATED_LE, EXPLICIT_BE, EXPLICIT_LE, IMPLICIT_LE

#: What pydicom may raise, lazily, on a damaged file.
PYDICOM_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    EOFError,
    OSError,
    struct.error,
    NotImplementedError,
    RuntimeError,
)


def decode_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised while pydicom decodes pixel data, means that the data cannot be decoded: one of
    :data:`PYDICOM_ERRORS`, or the panic of a decoder written in Rust (pylibjpeg-rle on a damaged RLE stream raises
    ``pyo3_runtime.PanicException``, which derives from BaseException, not Exception, and would stop a batch)."""
    return isinstance(exc, PYDICOM_ERRORS) or type(exc).__name__ == "PanicException"


#: Transfer syntaxes whose pixel data is read straight from the file, without a decoder.
NATIVE_SYNTAXES = frozenset({IMPLICIT_LE, EXPLICIT_LE})

# Transfer syntax families -> the package that decodes them (for error messages).
_DECODER_PACKAGES = {
    "1.2.840.10008.1.2.5": "pylibjpeg-rle (pip install pylibjpeg pylibjpeg-rle)",
    "1.2.840.10008.1.2.4.50": "pylibjpeg-libjpeg or pillow (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.51": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.57": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.70": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.80": "pylibjpeg-libjpeg or pyjpegls (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.81": "pylibjpeg-libjpeg or pyjpegls (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.90": "pylibjpeg-openjpeg (pip install pylibjpeg pylibjpeg-openjpeg)",
    "1.2.840.10008.1.2.4.91": "pylibjpeg-openjpeg (pip install pylibjpeg pylibjpeg-openjpeg)",
    "1.2.840.10008.1.2.4.201": "pylibjpeg-openjpeg >= 2.2 (pip install -U pylibjpeg pylibjpeg-openjpeg)",
    "1.2.840.10008.1.2.4.202": "pylibjpeg-openjpeg >= 2.2 (pip install -U pylibjpeg pylibjpeg-openjpeg)",
    "1.2.840.10008.1.2.4.203": "pylibjpeg-openjpeg >= 2.2 (pip install -U pylibjpeg pylibjpeg-openjpeg)",
}
_CONVERT_HINT = "convert the files to an uncompressed transfer syntax first (gdcmconv --raw IN OUT, or dcmdjpeg IN OUT)"


def syntax_name(uid: str) -> str:
    """The registered name of a transfer syntax UID, or 'unknown transfer syntax'."""
    from pydicom.uid import UID  # lazy: see the module docstring

    name = UID(uid).name
    return name if name and name != uid else "unknown transfer syntax"


def check_decoder(uid: str, where: str | Path) -> None:
    """Raise UnsupportedTransferSyntaxError if no installed decoder handles ``uid``."""
    if uid in NATIVE_SYNTAXES or uid in (DEFLATED_LE, EXPLICIT_BE):
        return
    from pydicom.pixels import get_decoder  # lazy: see the module docstring

    try:
        decoder = get_decoder(uid)
        available = decoder.is_available
        missing = "; ".join(str(m) for m in decoder.missing_dependencies) if not available else ""
    except NotImplementedError:
        available, missing = False, "no pixel data decoder exists for it in pydicom"
    if not available:
        package = _DECODER_PACKAGES.get(uid)
        install = f"install {package}, or {_CONVERT_HINT}" if package else f"no Python decoder is known for it: {_CONVERT_HINT}"
        raise UnsupportedTransferSyntaxError(
            f"pixel data is compressed with transfer syntax {uid} ({syntax_name(uid)}) and no installed decoder "
            f"handles it ({missing})",
            where=where,
            fix=install,
        )
