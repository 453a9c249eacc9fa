"""What the ingest modules share about pydicom: the exceptions it raises on damaged files and the
transfer-syntax checks made before it decodes pixel data.

pydicom is imported inside the functions that use it, on purpose: importing it takes a few hundred
milliseconds, and most files never need it (the raw header parser and the direct pixel reads handle
uncompressed little-endian data), so ``import pipeline.ingest`` and ``ctpipe --help`` stay fast.
"""

from __future__ import annotations

import io
import logging
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import CorruptPixelDataError, UnsupportedTransferSyntaxError
from .rawheader import DEFLATED_LE, EXPLICIT_BE, EXPLICIT_LE, IMPLICIT_LE

log = logging.getLogger(__name__)

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


def through_pixel_data(path: Path, end: int | None) -> Path | io.BytesIO:
    """What to give pydicom for a file whose compressed pixel data end at byte ``end`` with bytes after them (data
    set trailing padding, or bytes appended to the file): the file up to there, so that bytes appended are left out
    as they are after uncompressed pixel data; ``path`` itself when nothing follows (``end`` None)."""
    if end is None:
        return path
    with open(path, "rb") as fh:
        return io.BytesIO(fh.read(end))


def read_dataset(source: Path | io.BytesIO, **options: Any) -> Any:
    """pydicom's data set of ``source`` (a file, or its bytes through the pixel data), ``options`` passed to
    ``pydicom.dcmread``. A file without preamble and file meta information is read too (``force``): pydicom tells
    its encoding from the first element (implicit or explicit VR, little or big endian), and that encoding is set
    as its ``file_meta.TransferSyntaxUID``, so that its pixel data decode in the byte order they were written in
    (an Explicit VR Big Endian file of an old archive; without it pydicom refuses to decode them)."""
    import pydicom
    from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, ImplicitVRLittleEndian

    ds = pydicom.dcmread(source, force=True, **options)
    if "TransferSyntaxUID" not in ds.file_meta:
        implicit, little = getattr(ds, "original_encoding", (None, None))
        if implicit is not None and little is not None:
            guessed = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian if little else ExplicitVRBigEndian
            ds.file_meta.TransferSyntaxUID = guessed
    return ds


def stored_text(path: Path, tag: int) -> str | None:
    """The text of element ``tag`` of the file as stored (for a message about a value that could not be read), or
    None when the file lacks the element or cannot be read."""
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=[tag], force=True)
        elem = ds.get_item(tag)
    except PYDICOM_ERRORS as exc:
        log.debug("%s: element %08X not read again: %s", path, tag, exc)
        return None
    if elem is None or elem.value is None:
        return None
    raw = elem.value
    return raw.decode("latin-1").strip("\x00 ") if isinstance(raw, bytes) else str(raw)


#: Transfer syntaxes whose pixel data is read straight from the file, without a decoder.
NATIVE_SYNTAXES = frozenset({IMPLICIT_LE, EXPLICIT_LE})

# Transfer syntax families -> the package that decodes them (for error messages).
_DECODER_PACKAGES = {
    "1.2.840.10008.1.2.5": "pylibjpeg-rle (pip install pylibjpeg pylibjpeg-rle)",
    "1.2.840.10008.1.2.4.50": "pylibjpeg-libjpeg or pillow (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.51": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.57": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.70": "pylibjpeg-libjpeg (pip install pylibjpeg pylibjpeg-libjpeg)",
    "1.2.840.10008.1.2.4.80": "pyjpegls, or pylibjpeg-libjpeg (pip install pyjpegls)",
    "1.2.840.10008.1.2.4.81": "pyjpegls, or pylibjpeg-libjpeg (pip install pyjpegls)",
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


#: what to do about a file whose compressed pixel data is damaged
DAMAGED_PIXELS_FIX = (
    "copy the file again from the archive/PACS (or re-export the series from the scanner); if the archive's copy is "
    "damaged too, this image is lost: re-export the series from its source"
)

#: transfer syntax -> the decoder (pydicom plugin) used when it is installed: CharLS (pyjpegls) refuses damaged
#: JPEG-LS data that libjpeg (pylibjpeg), pydicom's fallback, decodes without error into an image with garbage in it
_STRICT_PLUGINS = {"1.2.840.10008.1.2.4.80": "pyjpegls", "1.2.840.10008.1.2.4.81": "pyjpegls"}


@cache
def decoding_plugin(uid: str) -> str:
    """The pydicom decoding plugin to decode transfer syntax ``uid`` with: the strict decoder of
    :data:`_STRICT_PLUGINS` when it is installed, else ``""`` (pydicom tries each installed plugin in turn; a
    warning, once per syntax, says what is lost without it)."""
    plugin = _STRICT_PLUGINS.get(uid)
    if plugin is None:
        return ""
    from pydicom.pixels import get_decoder  # lazy: see the module docstring

    if plugin in get_decoder(uid).available_plugins:
        return plugin
    log.warning(
        "%s is not installed: JPEG-LS pixel data (transfer syntax %s) is decoded by a decoder that turns damaged "
        "coded data into an image with garbage in it without an error; install it (pip install %s)",
        plugin,
        uid,
        plugin,
    )
    return ""


class _PluginFailures(logging.Filter):
    """The errors pydicom logs, with a traceback, when a decoding plugin fails on a frame and it tries the next
    plugin: collected for the decode :func:`decode_pixels` runs in this thread (and not logged: ctpipe's own error
    names them); records outside such a decode pass unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    @contextmanager
    def collect(self) -> Iterator[list[str]]:
        failures: list[str] = []
        self._local.failures = failures
        try:
            yield failures
        finally:
            self._local.failures = None

    def filter(self, record: logging.LogRecord) -> bool:
        failures = getattr(self._local, "failures", None)
        if failures is None or record.levelno < logging.ERROR:
            return True
        failures.append(" ".join(record.getMessage().split()))
        return False


_PLUGIN_FAILURES = _PluginFailures()
logging.getLogger("pydicom.pixels.decoders.base").addFilter(_PLUGIN_FAILURES)


def decode_pixels(ds: Any, uid: str, where: str | Path) -> Any:
    """``ds.pixel_array`` (stored values, decoded by :func:`decoding_plugin`), for a file ``where`` of transfer
    syntax ``uid``.

    Raises :class:`~pipeline.errors.CorruptPixelDataError` naming ``where``, the transfer syntax and the decoders'
    words when no decoder can decode the data (see :func:`decode_failure`), and also when one decoder refused it and
    pydicom's next one decoded it without error: a lenient decoder turns damaged data into an image with garbage in
    it.
    """
    plugin = decoding_plugin(uid)
    if plugin:
        ds.pixel_array_options(decoding_plugin=plugin)
    syntax = f"transfer syntax {uid} ({syntax_name(uid)})"
    with _PLUGIN_FAILURES.collect() as failures:
        try:
            arr = ds.pixel_array
        except BaseException as exc:
            if not decode_failure(exc):
                raise
            words = " ".join(str(exc).split())  # pydicom lists each plugin's error on its own line: one line here
            raise CorruptPixelDataError(
                f"the pixel data cannot be decoded: it is damaged or cut short ({type(exc).__name__}: {words}); {syntax}",
                where=where,
                fix=DAMAGED_PIXELS_FIX,
            ) from exc
    if failures:
        raise CorruptPixelDataError(
            f"a decoder refused the compressed pixel data ({'; '.join(failures)}) and another decoded it without "
            f"error: the data is damaged, and the image decoded from it cannot be trusted; {syntax}",
            where=where,
            fix=DAMAGED_PIXELS_FIX,
        )
    return arr
