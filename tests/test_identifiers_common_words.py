"""Patient names that are words of a CT series description, or hold a part too short to look for alone.

The demo phantoms' description "Chest phantom" read "Chest <patient>" outside DICOM, because their PatientName was
PHANTOM^n: every new user saw "<patient>" in the demo's findings and report. A real patient named CHEST^A keeps
"CHEST 1.25" as it is (one word of a description alone names nobody), but "CHEST A 1.25", the whole name, and
"CHEST ALAN 1.25" for CHEST^ALAN read as the name they are."""

from __future__ import annotations

from pipeline.identifiers import description_without_identifiers, identifiers_of
from pipeline.runner.redact import PathRedactor


def _described(text: str, name: str, pid: str = "") -> str:
    return description_without_identifiers(text, [("PatientName", name), ("PatientID", pid)])


def test_a_demo_phantoms_description_reads_as_it_is(tmp_path):
    from pipeline.ingest import load_series
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(3, matrix=64, slices=12, n_nodules=0)
    write_dicom_series(ph.volume, tmp_path, seed=3)
    assert load_series(tmp_path).metadata["SeriesDescription"] == "Chest phantom"
    # no part of the phantom's name is a word of its descriptions, nor of the folders the demo writes
    name = str(ph.volume.metadata["PatientName"])
    words = {"chest", "ct", "phantom", "phantoms", "case", "dicom"}
    assert not identifiers_of([("PatientName", name)]) & words, name


def test_one_description_word_alone_names_nobody():
    from pipeline.identifiers import COMMON_WORDS

    assert "chest" in COMMON_WORDS and "phantom" in COMMON_WORDS
    assert _described("CHEST 1.25", "CHEST^A") == "CHEST 1.25"
    assert _described("Chest phantom", "PHANTOM^4") == "Chest phantom"
    assert _described("BONE 1.0 B70f", "BONE^SOFT") == "BONE 1.0 B70f"
    # two of the patient's words, or one with another identifier: the name, redacted
    assert _described("BONE SOFT 1.0", "BONE^SOFT") == "<patient> <patient> 1.0"
    assert _described("CHEST ALAN 1.25", "CHEST^ALAN") == "<patient> <patient> 1.25"
    assert _described("CHEST 1234567", "CHEST^A", "1234567") == "<patient> <patient>"
    # a name that is not a description word is redacted alone, as before
    assert _described("CHEST DOE 1.25", "DOE^JANE") == "CHEST <patient> 1.25"


def test_a_name_with_a_short_part_is_redacted_written_whole():
    # the whole name, its parts in either order with any separator; not a word that begins with the short part
    assert _described("CHEST A 1.25", "CHEST^A") == "<patient> 1.25"
    assert _described("A, CHEST 1.25", "CHEST^A") == "<patient> 1.25"
    assert _described("CHEST ABDOMEN 1.25", "CHEST^A") == "CHEST ABDOMEN 1.25"
    assert _described("CHEST DOE J 1.25", "DOE^J") == "CHEST <patient> 1.25"
    assert _described("LI WEI 1.25", "LI^WEI") == "<patient> 1.25"
    assert _described("THORAX LI 1.25", "LI^WEI") == "THORAX LI 1.25"  # two letters alone: most names hold them


def test_folders_follow_the_same_rule():
    r = PathRedactor(secret="s")
    ids = identifiers_of([("PatientName", "CHEST^A"), ("PatientID", "1234567")])
    r.add_series(["/spool/CHEST/x.dcm", "/spool/CHEST_A/y.dcm", "/spool/chest_1234567/z.dcm"], ids)
    assert set(r.components) == {"CHEST_A", "chest_1234567"}
    r.add_series(["/spool/LI_WEI/x.dcm", "/spool/LI/y.dcm"], identifiers_of([("PatientName", "LI^WEI")]))
    assert set(r.components) == {"CHEST_A", "chest_1234567", "LI_WEI"}


def test_the_demos_samples_read_as_they_are():
    # data_samples/ was written when the phantoms were named PHANTOM^n: its folders (phantom_00001/) read as patient
    # tokens and its descriptions as "Chest <patient>" in the demo's console, run.log and report
    from pathlib import Path

    from pipeline.ingest import scan_directory

    samples = Path(__file__).resolve().parents[1] / "data_samples"
    scan = scan_directory(samples)
    assert [s.description for s in scan.series] == ["Chest phantom"] * 3
    r = PathRedactor(secret="s")
    r.add_scan(scan.series)
    r.add_files(f.path for f in scan.skipped_files)
    assert r.components == {}
