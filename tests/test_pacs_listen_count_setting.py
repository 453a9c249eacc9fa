"""``pacs.abort_count_check``: the counts ``ctpipe listen`` checks a series against when its sender ends with an
A-ABORT (Number of Series Related Instances, Images in Acquisition). A site whose modality ends every sending with an
A-ABORT and whose scanner counts in Images in Acquisition the images of series never routed to ctpipe has every series
held short of that count, and sending it again ends the same way: with the count left out of the setting, the series
is processed after the abort as after a release, the other checks (a gap, an A-ABORT in the middle of an instance)
still applying. The setting is validated when read, from every layer. Real sender: pynetdicom's C-STORE client."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import ConfigError
from tests._support.orthanc import write_phantom_series
from tests.test_pacs_listen_aborted_short import _OPTS, _counted, _note, _until
from tests.test_pacs_listen_receive import _abort_mid_instance, _listener, _send, _until_cut

pytestmark = pytest.mark.pacs

SERIES, ACQUISITION = "NumberOfSeriesRelatedInstances", "ImagesInAcquisition"


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("count_setting") / "case", 14, slices=8)


def _held(run: Path, uid: str) -> str:
    deadline = time.monotonic() + 60
    while "A-ABORT" not in _note(run, uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _note(run, uid)


@pytest.mark.parametrize("setting", ["none", [], [SERIES]])
def test_a_series_short_of_an_untrusted_count_is_processed_after_the_senders_abort(series, tmp_path, caplog, setting):
    """5 of 8 slices, each saying Images in Acquisition 8 (the other 3 went to another node), then the sender's
    A-ABORT: with Images in Acquisition left out of pacs.abort_count_check, the series is processed as a done case
    from its 5 slices, as after a release; no cut-off warning (was: held, then quarantined)."""
    _, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    outcomes: list = []
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(tmp_path / "run", **_OPTS, **{"pacs.series_limit_s": 3600.0, "pacs.abort_count_check": setting}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets[:5], end="abort") == [0] * 5
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]
    assert not [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
    ended = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_aborted"]
    assert len(ended) == 1 and "pacs.abort_count_check" in ended[0], ended


def test_a_count_still_trusted_still_holds_a_short_series(series, tmp_path):
    """pacs.abort_count_check = [NumberOfSeriesRelatedInstances]: a series short of the Number of Series Related
    Instances its instances give is still held as cut off after the sender's A-ABORT."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0, "pacs.abort_count_check": [SERIES]}) as lst:
        assert _send(lst.port, _counted(files, NumberOfSeriesRelatedInstances=len(files))[:5], end="abort") == [0] * 5
        held = _held(run, uid)
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == []
    assert "sender cut off" in held and f"5 of {len(files)}" in held and SERIES in held, held


def test_with_no_count_checked_a_gap_and_an_abort_mid_instance_still_hold_the_series(series, tmp_path, caplog):
    """pacs.abort_count_check = none leaves the other checks in force: a series with a slice missing between those
    received (then the sender's A-ABORT) waits for it, and one whose sender's A-ABORT came in the middle of an
    instance is held as cut off; neither is processed once quiet."""
    uid, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    opts = {**_OPTS, "pacs.series_limit_s": 3600.0, "pacs.abort_count_check": "none"}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(tmp_path / "gap", **opts) as lst:
        sent = datasets[:3] + datasets[4:6]  # the fourth slice never sent
        assert _send(lst.port, sent, end="abort") == [0] * len(sent)
        time.sleep(1.0)
        assert lst.step() == [] and lst.step() == []
        assert "MissingSliceError" in _note(tmp_path / "gap", uid), _note(tmp_path / "gap", uid)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(tmp_path / "mid", **opts) as lst:
        _abort_mid_instance(lst.port, [ds for ds, _ in datasets[:5]])
        held = _until_cut(tmp_path / "mid", uid)  # no A-ABORT between instances: its note says cut off, not A-ABORT
        time.sleep(0.4)
        assert lst.step() == []
    assert "sender cut off" in held and "4 instance(s)" in held, held
    assert len([r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]) == 1


def test_the_hold_and_the_quarantine_name_the_setting_and_when_to_use_it(series, tmp_path, caplog):
    """By default (both counts checked), 5 of 8 slices saying Images in Acquisition 8 then an A-ABORT: the held
    series' warning, its note and its quarantine line name pacs.abort_count_check, the value that leaves that count
    out, and when to set it (was: only 'send the series again', which ends the same way at such a site)."""
    uid, files = series
    run = tmp_path / "run"
    outcomes: list = []
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(run, **_OPTS, **{"pacs.series_limit_s": 2.0}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        held = _held(run, uid)
        _until(lambda: bool(outcomes), lst)
    warned = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    for said in (held, warned[0], outcomes[0].line()):
        for part in (f"pacs.abort_count_check: [{SERIES}]", "every sending with an A-ABORT", "not sent here"):
            assert part in said, (part, said)


#: the two count settings: after a sender's A-ABORT, after its release; the same values, the same default
COUNT_SETTINGS = ["abort_count_check", "release_count_check"]


@pytest.mark.parametrize("key", COUNT_SETTINGS)
@pytest.mark.parametrize(
    "value,expected",
    [
        (None, [SERIES, ACQUISITION]),
        ("none", []),
        ([], []),
        (ACQUISITION, [ACQUISITION]),
        (f"{SERIES}, {ACQUISITION}", [SERIES, ACQUISITION]),
        ("imagesinacquisition", [ACQUISITION]),  # a keyword in any letter case, as every name of a fixed set
    ],
)
def test_the_setting_is_read_from_every_layer(tmp_path, key, value, expected):
    """The default checks both counts (nothing incomplete published unless the site says otherwise); none or []
    neither; a list (or a comma-separated string) those named."""
    if value is None:
        assert getattr(load_config(environ={}).pacs, key) == expected
        return
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"pacs:\n  {key}: {value if value != [] else '[]'}\n")
    assert getattr(load_config(yaml_file, environ={}).pacs, key) == expected
    env = {f"CTPIPE_PACS_{key.upper()}": value if isinstance(value, str) else "[]"}
    assert getattr(load_config(environ=env).pacs, key) == expected
    assert getattr(load_config(overrides={f"pacs.{key}": value}, environ={}).pacs, key) == expected


@pytest.mark.parametrize("key", COUNT_SETTINGS)
@pytest.mark.parametrize("value", [False, "ImagesInAcq", "Images_In_Acquisition", [SERIES, "AcquisitionNumber"]])
def test_a_bad_setting_is_refused_when_read_naming_the_option_and_the_allowed_values(tmp_path, key, value):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"pacs:\n  {key}: {value!r}\n" if not isinstance(value, list) else "")
    layers = [({"overrides": {f"pacs.{key}": value}, "environ": {}}, "overrides")]
    if not isinstance(value, list):
        layers.append(({"path": yaml_file, "environ": {}}, str(yaml_file)))
    for kwargs, source in layers:
        with pytest.raises(ConfigError) as err:
            load_config(**kwargs)
        assert err.value.where == source
        assert f"pacs.{key}" in err.value.problem and ACQUISITION in err.value.problem, err.value.problem
        assert "none" in err.value.problem, err.value.problem


def test_a_series_held_short_is_processed_once_sent_again_to_a_listener_restarted_with_the_count_left_out(series, tmp_path):
    """The same 5 slices sent again by the same sender (ending with an A-ABORT again) to a listener restarted with
    Images in Acquisition left out of pacs.abort_count_check: the series is processed as a done case, once."""
    uid, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))[:5]
    run = tmp_path / "run"
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst:
        assert _send(lst.port, datasets, end="abort") == [0] * 5
        assert "pacs.abort_count_check" in _held(run, uid)
    outcomes: list = []
    opts = {**_OPTS, "pacs.series_limit_s": 3600.0, "pacs.abort_count_check": [SERIES]}
    with _listener(run, **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets, end="abort") == [0] * 5
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]


@pytest.mark.parametrize("restarted_with", [[SERIES], "none"])
def test_a_restart_with_the_count_left_out_lifts_the_hold_without_sending_again(series, tmp_path, caplog, restarted_with):
    """A series held short of the Images in Acquisition its instances give, the listener restarted with that count
    left out of pacs.abort_count_check: the current setting decides, and the series is processed as a done case once
    quiet, nothing sent again; one INFO line says why (was: held until the sender sent it again, then quarantined
    after pacs.series_limit_s)."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        assert "pacs.abort_count_check" in _held(run, uid)
    outcomes: list = []
    opts = {**_OPTS, "pacs.series_limit_s": 3600.0, "pacs.abort_count_check": restarted_with}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]
    lifted = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_hold_lifted"]
    assert len(lifted) == 1 and uid in lifted[0] and f"5 of {len(files)}" in lifted[0], lifted


def test_a_series_quarantined_short_is_run_again_after_a_restart_with_the_count_left_out(series, tmp_path, caplog):
    """Held short of its Images in Acquisition, then quarantined after pacs.series_limit_s (its files kept for
    pacs.incomplete_keep_s); the listener restarted with that count left out: its quarantined case is run again from
    the files kept and done, nothing sent again (was: quarantined until the sender sent it again)."""
    uid, files = series
    run = tmp_path / "run"
    first: list = []
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 1.0}) as lst:
        lst.on_series = first.append
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        _until(lambda: bool(first), lst)
    assert [o.status for o in first] == ["quarantined"], [o.line() for o in first]
    outcomes: list = []
    opts = {**_OPTS, "pacs.series_limit_s": 1.0, "pacs.abort_count_check": [SERIES]}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances, o.case_id) for o in outcomes] == [("done", 5, first[0].case_id)], [
        o.line() for o in outcomes
    ]
    lifted = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_hold_lifted"]
    assert len(lifted) == 1 and "run again" in lifted[0], lifted


def test_a_restart_with_the_count_still_checked_keeps_the_hold(series, tmp_path):
    """Restarted with the setting unchanged, or with only the other count left out: the series short of its Images in
    Acquisition stays held (not processed once quiet), its note still naming the count and the fix."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        before = _held(run, uid)
    for restarted_with in (None, [ACQUISITION]):
        opts = {**_OPTS, "pacs.series_limit_s": 3600.0}
        if restarted_with is not None:
            opts["pacs.abort_count_check"] = restarted_with
        with _listener(run, **opts) as lst:
            time.sleep(0.4)  # past the quiet period
            assert lst.step() == []
        after = _note(run, uid)
        assert after.startswith("sender cut off") and f"5 of {len(files)}" in after, (before, after)
    assert "pacs.abort_count_check: none" in _note(run, uid), _note(run, uid)


def test_the_restart_summary_counts_the_series_whose_hold_it_lifted(series, tmp_path, caplog):
    """A series held short of its Images in Acquisition, the listener restarted with that count left out: the restart's
    summary line counts it with what else the start did (was: only its INFO line said so, the summary nothing)."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        assert "pacs.abort_count_check" in _held(run, uid)
    opts = {**_OPTS, "pacs.series_limit_s": 3600.0, "pacs.abort_count_check": [SERIES]}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts):
        pass
    summary = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_recover"]
    assert len(summary) == 1, summary
    assert "1 series held short of a count released by the current pacs.abort_count_check" in summary[0], summary
