"""The identifiers of the patient of a ZIP or tar export (``DOE_JANE_MRN12345.zip``), read from the header of a DICOM
file inside it without unpacking anything: a run redacts the archive's name by them
(:meth:`pipeline.runner.redact.PathRedactor.add_files`), also when none of that patient's series is among the sources."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..identifiers import MATCHED, identifiers_of

#: The members of an archive read for the identifiers of its DICOM files (the first DICOM one among them decides).
ARCHIVE_MEMBERS_READ = 32


def archive_identifiers(path: str | os.PathLike[str]) -> set[str]:
    """The identifiers (:func:`pipeline.identifiers.identifiers_of`) of the patient of the first DICOM file among the
    first :data:`ARCHIVE_MEMBERS_READ` members of ``path`` when it is a ZIP or tar archive (compressed or not), read
    from that member's header without unpacking anything; an empty set for any other file, an archive that cannot be
    read or one without a DICOM file there."""
    import tarfile
    import zipfile

    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    from ..ingest.image import archive_kind

    def of(stream: Any) -> set[str]:
        try:
            ds = dcmread(stream, stop_before_pixels=True, specific_tags=list(MATCHED))
        except (InvalidDicomError, EOFError, ValueError, KeyError, OSError):
            return set()
        return identifiers_of((k, str(ds.get(k) or "")) for k in MATCHED)

    kind = archive_kind(Path(path))
    try:
        if kind == "ZIP":
            with zipfile.ZipFile(path) as zf:
                for entry in [i for i in zf.infolist() if not i.is_dir()][:ARCHIVE_MEMBERS_READ]:
                    with zf.open(entry) as member:
                        if ids := of(member):
                            return ids
        elif kind == "tar":
            with tarfile.open(path) as tf:
                for n, tar_entry in enumerate(tf):
                    if n >= ARCHIVE_MEMBERS_READ:
                        break
                    file = tf.extractfile(tar_entry) if tar_entry.isfile() else None
                    if file is not None and (ids := of(file)):
                        return ids
    except (OSError, EOFError, RuntimeError, zipfile.BadZipFile, tarfile.TarError):  # RuntimeError: an encrypted ZIP
        pass
    return set()
