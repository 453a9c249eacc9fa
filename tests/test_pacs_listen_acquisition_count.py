"""``ctpipe listen`` and a scanner whose Images in Acquisition (0020,1002) counts the images of several series of one
acquisition (each series' instances say 8, the two series hold 4 each), sent by a sender that ends its associations
with an A-ABORT: the series of the study that share the acquisition and its count, each short of it alone, are counted
together, and when they reach it exactly none is held as cut off. Real sender: pynetdicom's C-STORE client."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import pytest
from pydicom.uid import generate_uid

from tests._support.orthanc import write_phantom_series
from tests.test_pacs_listen_aborted_short import _OPTS, _counted, _note, _until
from tests.test_pacs_listen_receive import _listener, _send

pytestmark = pytest.mark.pacs


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("acquisition") / "case", 13, slices=8)


def _two_series(files: list[Path], *, count: int = 8) -> tuple[list, list]:
    """The phantom's 8 slices as two series of one study and acquisition (4 + 4, Acquisition Number 1), each instance
    saying Images in Acquisition ``count``."""
    datasets = _counted(files, ImagesInAcquisition=count)
    second, number = generate_uid(), None
    for ds, _ in datasets:
        ds.AcquisitionNumber = 1
        number = number or int(ds.get("SeriesNumber", 1) or 1) + 1
    for ds, _ in datasets[4:]:
        ds.SeriesInstanceUID = second
        ds.SeriesNumber = number
    return datasets[:4], datasets[4:]


def test_two_series_counted_together_by_images_in_acquisition_in_one_association_are_processed(series, tmp_path, caplog):
    """Both series in one association ended by the sender's A-ABORT: 4 + 4 of the acquisition's 8, so both are
    processed as done cases, no cut-off warning (was: each held as '4 of 8 image(s) of acquisition 1 received', then
    quarantined)."""
    _, files = series
    first, second = _two_series(files)
    outcomes: list = []
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(tmp_path / "run", **_OPTS, **{"pacs.series_limit_s": 3.0}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, first + second, end="abort") == [0] * 8
        _until(lambda: len(outcomes) >= 2, lst)
    assert sorted((o.status, o.n_instances) for o in outcomes) == [("done", 4), ("done", 4)], [o.line() for o in outcomes]
    assert not [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
    ended = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_aborted"]
    assert len(ended) == 2 and all("ImagesInAcquisition 8" in m and "2 series" in m for m in ended), ended


@pytest.mark.parametrize("end", ["abort", "release"])
def test_a_series_held_short_is_released_when_the_other_series_of_its_acquisition_arrives(series, tmp_path, caplog, end):
    """One association per series, the first ended by the sender's A-ABORT: the first series, 4 of 8 alone, is held;
    the second's 4, on an association ended either way, make the 8, so the first's hold is lifted (one INFO line says
    why) and both are processed (was: the first quarantined after pacs.series_limit_s)."""
    uid, files = series
    first, second = _two_series(files)
    run = tmp_path / "run"
    outcomes: list = []
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, first, end="abort") == [0] * 4
        deadline = time.monotonic() + 60
        while "A-ABORT" not in _note(run, uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "4 of 8" in _note(run, uid), _note(run, uid)
        assert _send(lst.port, second, end=end) == [0] * 4
        _until(lambda: len(outcomes) >= 2, lst)
    assert sorted((o.status, o.n_instances) for o in outcomes) == [("done", 4), ("done", 4)], [o.line() for o in outcomes]
    lifted = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_count_reached"]
    assert len(lifted) == 1 and uid in lifted[0] and "ImagesInAcquisition 8" in lifted[0], lifted


def test_series_are_counted_together_only_when_each_is_short_alone_and_they_make_the_count(series, tmp_path):
    """A series whole on its own (another acquisition numbered 1, as pre- and post-contrast) does not make up
    another's shortfall, and series whose images exceed the count are not taken as its parts."""
    from pipeline.pacs.expected_count import count_check

    _, files = series

    def folder(name: str, datasets: list) -> Path:
        out = tmp_path / name
        out.mkdir()
        for i, (ds, _) in enumerate(datasets):
            ds.save_as(out / f"{i:03d}.dcm", enforce_file_format=True)
        return out

    first, second = _two_series(files)
    a, b = folder("a", first), folder("b", second)
    whole = count_check(a, siblings={"b": b})
    assert whole.short is None and whole.pooled == ("b",) and "ImagesInAcquisition 8" in str(whole.counted), whole
    assert count_check(a).short is not None  # alone: 4 of 8
    pre = folder("pre", first + second)  # another acquisition numbered 1, whole alone: its own 8 of 8
    post = folder("post", first[:3])
    assert count_check(post, siblings={"pre": pre}).short is not None  # 3 of 8
    beside = count_check(a, siblings={"b": b, "pre": pre})  # a's 4 and b's 4 make the 8; pre counts its own
    assert beside.short is None and beside.pooled == ("b",), beside
    third = [(copy.deepcopy(ds), ts) for ds, ts in second[:3]]
    for ds, _ in third:
        ds.SeriesInstanceUID, ds.SOPInstanceUID = "1.2.3.4", generate_uid()
    over = count_check(a, siblings={"b": b, "c": folder("c", third)})  # 4 + 4 + 3 > 8: not the count's parts
    assert over.short is not None and over.pooled == (), over


def test_a_series_short_of_its_count_with_siblings_that_cannot_make_it_up_is_read_no_further(series, tmp_path, monkeypatch):
    """A sender that ends an association after each instance has the count checked at each: while the series and the
    siblings giving its count hold fewer instances than it, only the first instance of each is read (not every one of
    each, every time)."""
    import pipeline.pacs.expected_count as expected_count

    _, files = series
    first, second = _two_series(files, count=16)
    folders = {}
    for name, datasets in (("a", first), ("b", second)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for i, (ds, _) in enumerate(datasets):
            ds.save_as(folders[name] / f"{i:03d}.dcm", enforce_file_format=True)
    reads: list[Path] = []
    real_read = expected_count._read
    monkeypatch.setattr(expected_count, "_read", lambda path: (reads.append(path), real_read(path))[1])
    check = expected_count.count_check(folders["a"], siblings={"b": folders["b"]})
    assert check.short is not None and "4 of 16" in check.short, check
    assert len(reads) == 2, reads
