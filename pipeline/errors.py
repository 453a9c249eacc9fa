"""Exception classes for every stage of ctpipe.

Every error names *where* the problem is (a file, a series, a case, a config
key), *what* is wrong (with the offending value) and, where there is one,
*how to fix it*. Catch :class:`CtpipeError` to handle any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def printable(text: str) -> str:
    """``text`` with what cannot be written as UTF-8 escaped: the bytes of a file name that are not valid UTF-8 (held by
    Python as lone surrogates, e.g. a Latin-1 'ä' from an old archive) as ``\\xNN``, any other lone surrogate as
    ``\\uNNNN``. Messages, logs, the run store and the reports can then always be written."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for ch in text:
        if "\udc80" <= ch <= "\udcff":  # a byte os.fsdecode could not decode (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


class CtpipeError(Exception):
    """Base class of all ctpipe errors.

    Parameters
    ----------
    message:
        What is wrong, with the offending value.
    where:
        The file, series, case or config key concerned (shown first).
    fix:
        What the user can do about it (shown last), if anything.
    """

    def __init__(self, message: str, *, where: str | Path | None = None, fix: str | None = None):
        self.problem = printable(message)
        self.where = printable(str(where)) if where is not None else None
        self.fix = printable(fix) if fix is not None else None
        message, fix = self.problem, self.fix
        text = message
        if self.where:
            text = f"{self.where}: {text}"
        if fix:
            text = f"{text}. Fix: {fix}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:  # keep errors picklable across worker processes
        return (_rebuild, (type(self), self.problem, self.where, self.fix))


def _rebuild(cls: type[CtpipeError], message: str, where: str | None, fix: str | None) -> CtpipeError:
    err = cls.__new__(cls)
    CtpipeError.__init__(err, message, where=where, fix=fix)
    return err


def require_path(value: Any, *, where: str, error: type[CtpipeError], what: str = "a folder or file", fix: str) -> Path:
    """``value`` as a :class:`Path` when it is one path (a str or an os.PathLike), not empty; else ``error`` naming the
    argument ``where``, the value given, and ``fix``."""
    import os

    if isinstance(value, (str, os.PathLike)):
        if not os.fspath(value).strip():  # Path("") is the current folder: a variable that was never set
            raise error(f"is empty ({value!r}), which names the current folder ({os.getcwd()})", where=where, fix=fix)
        return Path(value)
    raise error(f"must be {what} (a str or a pathlib.Path), got {described(value)}", where=where, fix=fix)


def unexpanded_home(path: Any) -> str | None:
    """For a path written with a leading ``~`` (``"~/scans"``, ``"~alice/scans"``): the note that Python does not expand
    it, as a shell does, naming the path it stands for; None for any other path."""
    import os

    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.startswith("~"):
        return None
    expanded = os.path.expanduser(text)
    if expanded == text:  # '~nobody': no such user, nothing to suggest
        return None
    return f"Python does not expand '~' as a shell does: pass os.path.expanduser({text!r}) ({expanded})"


def refuse_unexpanded_home(path: Any, *, what: str | None = None) -> None:
    """A :class:`CtpipeError` (naming ``what``, else the path) for a path to write under that starts with ``~`` while
    the working folder holds no folder of that name: written as it is, it would make one there, beside the files
    meant for the home folder (and a shell's ``rm -r ~`` meant to remove it removes the home folder)."""
    import os

    note = unexpanded_home(path)
    if note is None:
        return
    text = os.fspath(path)
    first = text.split(os.sep, 1)[0]
    if os.path.isdir(first):  # a folder really named so: the path names it
        return
    raise CtpipeError(
        f"{text} starts with '~', which Python does not expand: written as it is, it would make a folder named "
        f"{first!r} in {os.getcwd()}",
        where=what or text,
        fix=note,
    )


def missing_path_fix(path: Any, fix: str) -> str:
    """``fix`` for a path that does not exist, with :func:`unexpanded_home`'s note when it starts with ``~``."""
    note = unexpanded_home(path)
    return f"{fix}; {note}" if note else fix


def require_bool(value: Any, *, name: str, error: type[CtpipeError]) -> bool:
    """``value`` when it is True or False (a NumPy bool too); else ``error`` naming ``name``: a string such as ``"no"``
    is true, and taken as a switch would do the opposite of what it says."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise error(f"{name}={value!r} is not True or False", where=name, fix=f"pass {name}=True or {name}=False")


def require_text(value: Any, *, name: str, error: type[CtpipeError]) -> str | None:
    """``value`` when it is a str or None; else ``error`` naming ``name``: a number given for an identifier (a case id,
    a UID) would be written or looked up as other text than the caller has."""
    if value is None or isinstance(value, str):
        return value
    raise error(
        f"{name}={value!r:.80} is not text ({type(value).__name__})",
        where=name,
        fix=f"pass it as a str, e.g. {name}={str(value)!r:.80}",
    )


def described(value: Any) -> str:
    """``value`` named in a message: its type and, for an array (a NumPy array, a tensor), its shape and dtype rather
    than its values; else its repr, at most 200 characters."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        return f"{type(value).__name__} of shape {shape}, dtype {dtype}"
    return f"{type(value).__name__} {value!r:.200}"


# --- geometry ---------------------------------------------------------------------------
class GeometryError(CtpipeError, ValueError):
    """Spacing, origin or direction cosines are not a valid LPS geometry."""


class NotAVolumeError(CtpipeError, TypeError):
    """A function that takes a :class:`~pipeline.volume.CTVolume` was given something else (a path, an array)."""


class LabelMapError(CtpipeError, ValueError):
    """An image file given where a CT in HU is needed holds a label map (a segmentation, a mask) instead."""


# --- DICOM ingest -----------------------------------------------------------------------
class DicomError(CtpipeError):
    """Base class for problems with DICOM input."""


class NotDicomError(DicomError):
    """The file is not a DICOM Part 10 file (no 'DICM' preamble, unreadable header)."""


class TruncatedFileError(DicomError):
    """The file ends before its header or pixel data is complete."""


class CorruptPixelDataError(TruncatedFileError):
    """The compressed pixel data of a file is damaged: a codestream without its start marker, with a marker inside its
    coded data or a header that does not fit the image, or one the decoder refuses. A subclass of
    :class:`TruncatedFileError` (damaged pixel data was reported as such before), so that handlers of it still apply."""


class UnreadableFileError(DicomError):
    """A file or folder cannot be read: permission denied, gone since it was listed, a symbolic link loop, ..."""


class CorruptHeaderError(DicomError):
    """A DICOM header is damaged or holds values that cannot be parsed."""


class MissingPixelDataError(DicomError):
    """An image instance has no PixelData element."""


class UnsupportedTransferSyntaxError(DicomError):
    """The pixel data is compressed with a syntax no installed decoder handles."""


class NotCTError(DicomError):
    """The series is not a CT image series (e.g. MR, SR, SEG)."""


class MixedPatientsError(DicomError):
    """The files of one series name different patients (a misfiled image): never processed as one case."""


class SeriesGeometryError(DicomError):
    """Slices of one series do not form a regular volume."""


class InconsistentSeriesError(SeriesGeometryError):
    """Slices differ in rows/columns, pixel spacing or orientation."""


class SingleSliceError(SeriesGeometryError):
    """A series has too few slices to build a volume."""


class MissingSliceError(SeriesGeometryError):
    """A gap in slice positions larger than the spacing tolerance."""


class DuplicateSliceError(SeriesGeometryError):
    """Two or more slices share one position.

    ``pairs``: the slices concerned, as pairs of indices into the sequence that was checked (empty when not known).
    """

    pairs: tuple[tuple[int, int], ...] = ()


class NonUniformSpacingError(SeriesGeometryError):
    """Slice positions are not equally spaced within the tolerance."""


class GantryTiltError(SeriesGeometryError):
    """Slice positions do not advance along the slice normal (tilted gantry)."""


class NoSeriesFoundError(DicomError):
    """A scan found no CT series that matches the selection rules."""


class AmbiguousSeriesError(DicomError):
    """Several series qualify where exactly one was expected."""


# --- case cache -------------------------------------------------------------------------
class CacheError(CtpipeError):
    """A case cache entry is missing, truncated or disagrees with its sidecar."""


# --- loader -----------------------------------------------------------------------------
class LoaderError(CtpipeError):
    """A loader could not turn a cached case into a model input."""


# --- detection (models) -----------------------------------------------------------------
class ModelError(CtpipeError):
    """A model or bundle cannot be loaded or run."""


class BundleError(ModelError):
    """A MONAI bundle directory is incomplete or its config is incompatible."""


class WeightsMismatchError(ModelError):
    """A state dict does not fit the network (missing, unexpected or mis-shaped keys)."""


class InputTooSmallError(ModelError):
    """A volume is smaller than the network's minimum input."""


class InvalidVolumeError(ModelError):
    """A volume's voxel values cannot be used (too many NaN or infinite voxels)."""


class FindingsFileError(CtpipeError, ValueError):
    """A file given as a findings JSON cannot be read as one (missing, not JSON, another kind of document)."""


# --- reconstruction ---------------------------------------------------------------------
class ReconstructionError(CtpipeError):
    """An organ could not be segmented, meshed or measured."""


# --- DICOM results (structured report, segmentation) ------------------------------------
class DicomOutputError(CtpipeError):
    """A DICOM result object (SR, SEG) cannot be written or read back (bad finding, mask or option)."""


class SourceMismatchError(DicomOutputError):
    """The source DICOM files do not match the volume's slices, or lack an attribute needed to reference them."""


class SeriesStillWrittenError(SourceMismatchError):
    """A series was still being written into the source while a run processed it (files of it arrived, or changed
    size or modification time, since the run found it): not a fault of the data. ``ctpipe run`` publishes nothing
    of the case and leaves it for the next run, which takes the whole series."""


# --- PACS (DICOMweb, DIMSE: sources, listener, result sending) ---------------------------
class PacsError(CtpipeError):
    """Base class for problems with a PACS: its address, reaching it, or what it answered."""


class PacsAddressError(PacsError, ValueError):
    """A PACS source or destination address (URL, query, AE title, credentials) is not valid."""


class PacsUnavailableError(PacsError):
    """A PACS cannot be reached or does not answer in time (after the configured retries)."""


class PacsRequestError(PacsError):
    """A PACS refused or failed a request (HTTP error, association rejected, DIMSE failure status)."""


class PacsReceiverError(PacsError):
    """ctpipe's own C-MOVE receiver cannot listen (``pacs.move_port`` taken by another process, ``pacs.bind`` not an
    address of this machine): nothing can be retrieved by C-MOVE until it is changed, so it is not retried."""


class PartialSeriesError(PacsError):
    """Fewer instances of a series were retrieved than the PACS listed for it."""


# --- runner -----------------------------------------------------------------------------
class RunStoreError(CtpipeError):
    """A run directory or its database is missing or unreadable, or a case's state change is not allowed."""


class FatalRunError(CtpipeError):
    """A worker cannot work at all (e.g. the model cannot be loaded): the run stops."""


class RunEnvironmentError(CtpipeError):
    """The run folder cannot be written (disk full, read-only, no permission, quota, file-size limit): the run stops; a rerun resumes."""


class IncompleteOutputError(CtpipeError):
    """A case's stage did not write every output file it declares: the case is not published."""


class StageTimeoutError(CtpipeError):
    """A stage of a case ran longer than ``runner.stage_timeout_s``: its worker was stopped and the case quarantined."""


class ClusterError(CtpipeError):
    """The Ray cluster of ``runner.engine = ray`` cannot be reached, joined or used (address, token, resources)."""


# --- configuration ----------------------------------------------------------------------
class ConfigError(CtpipeError, ValueError):
    """A configuration key or value is invalid."""


class UsageError(CtpipeError, ValueError):
    """A value given on the command line is not allowed (a flag's value, a ``--set`` item, flags that do not go
    together): ``ctpipe`` exits with status 2, as for the values argparse itself refuses."""


# --- synthetic phantoms (test and demo data) --------------------------------------------
class PhantomError(CtpipeError, ValueError):
    """A phantom option is out of range, or the requested nodules do not fit in the lungs."""


class DicomWriteError(CtpipeError, ValueError):
    """A volume or an option cannot be written as a DICOM series (unknown quirk, transfer syntax, ...)."""


# --- notebook display ---------------------------------------------------------------------
class DisplayArgumentError(CtpipeError, TypeError, ValueError, IndexError):
    """An argument of :func:`pipeline.show` cannot be drawn (``recon=``, ``slice=``/``k=``, ``window=``, ``ax=``): the
    message names the argument, the value given and what to pass. Also a TypeError, ValueError and IndexError, as
    the plain errors that argument checks raise elsewhere."""
