"""CSV files as spreadsheets export them: byte-order mark, semicolons or tabs, Windows line ends, padded names."""

from __future__ import annotations

import pytest

from pipeline.csvfile import read_table


@pytest.mark.parametrize(
    "raw",
    [
        b"path,case_id\n/a,x\n/b,\n",
        b"\xef\xbb\xbfpath,case_id\r\n/a,x\r\n/b,\r\n",  # Excel "CSV UTF-8"
        b"path;case_id\r\n/a;x\r\n/b;\r\n",  # Excel where the decimal separator is a comma
        b"path\tcase_id\n/a\tx\n/b\t\n",
        b" path , case_id \n/a,x\n\n/b\n,\n",  # padded names, a blank line, a short row, an empty row
    ],
    ids=["plain", "bom-crlf", "semicolon", "tab", "ragged"],
)
def test_spreadsheet_exports_read_as_the_plain_file(tmp_path, raw):
    path = tmp_path / "t.csv"
    path.write_bytes(raw)
    table = read_table(path)
    assert table.columns == ["path", "case_id"]
    assert table.rows == [{"path": "/a", "case_id": "x"}, {"path": "/b", "case_id": ""}]


def test_commas_inside_quoted_cells_and_a_one_column_file(tmp_path):
    (tmp_path / "q.csv").write_text('path;note\n"/data/a;b";"x, y"\n', encoding="utf-8")
    assert read_table(tmp_path / "q.csv").rows == [{"path": "/data/a;b", "note": "x, y"}]
    (tmp_path / "one.csv").write_text("\ufeffseriesuid\n1.2.3\n", encoding="utf-8")
    assert read_table(tmp_path / "one.csv") == (["seriesuid"], [{"seriesuid": "1.2.3"}])
    (tmp_path / "empty.csv").write_text("")
    assert read_table(tmp_path / "empty.csv") == ([], [])
