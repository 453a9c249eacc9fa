"""CSV files that users write by hand or export from a spreadsheet: worklists, UID lists, annotations.

A spreadsheet writes what a plain :class:`csv.DictReader` misreads: a UTF-8 byte-order mark before the first
column name (Excel's "CSV UTF-8"), semicolons or tabs between the columns (Excel where the decimal separator is a
comma), spaces around the column names, Windows line ends. :func:`read_table` takes all of them.
"""

from __future__ import annotations

import csv
import io
import os
from typing import NamedTuple

#: the column separators :func:`read_table` recognises in the header line
DELIMITERS = (",", ";", "\t")


class CsvTable(NamedTuple):
    """A CSV file's column names (stripped) and its rows, each a dict keyed by those names (missing cells ``""``)."""

    columns: list[str]
    rows: list[dict[str, str]]


def read_table(path: str | os.PathLike[str]) -> CsvTable:
    """The CSV file at ``path``: UTF-8 with or without a byte-order mark, its columns separated by the one of
    :data:`DELIMITERS` its header line holds most of (commas when it holds none).

    Raises what reading raises (``OSError``, ``UnicodeDecodeError``, ``csv.Error``) for the caller to report with
    its own error class.
    """
    with open(path, newline="", encoding="utf-8-sig") as fh:
        text = fh.read()
    header = text.splitlines()[0] if text else ""
    delimiter = max(DELIMITERS, key=header.count) if any(d in header for d in DELIMITERS) else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    lines = [line for line in reader if any(cell.strip() for cell in line)]  # blank lines (or only separators) skipped
    if not lines:
        return CsvTable([], [])
    columns = [name.strip() for name in lines[0]]
    rows = [{name: (line[n] if n < len(line) else "") for n, name in enumerate(columns)} for line in lines[1:]]
    return CsvTable(columns, rows)
