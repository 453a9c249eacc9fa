"""pacs.send_to and pacs.ae_title are checked when the configuration is read, from every layer; ``ctpipe listen``'s
own default of runner.workers = 0 gives way to the config file, the environment and --set."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import ConfigError
from tests._support.cli import ConfigOnlyListener

BAD = {
    "send_to": ["dimse://host:104", "ftp://pacs.example.org", "dimse://PACS@h:104?studydate=today"],
    "ae_title": ["THIS_TITLE_IS_WAY_TOO_LONG", "BACK\\SLASH"],
}


@pytest.mark.parametrize("key,value", [(k, v) for k, vs in BAD.items() for v in vs])
def test_a_bad_pacs_value_is_refused_when_read_naming_the_option(tmp_path, key, value):
    path = f"pacs.{key}"
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"pacs:\n  {key}: '{value}'\n")
    layers: list[tuple[dict[str, Any], str]] = [
        ({"path": yaml_file, "environ": {}}, str(yaml_file)),
        ({"environ": {f"CTPIPE_PACS_{key.upper()}": value}}, f"environment variable CTPIPE_PACS_{key.upper()}"),
        ({"overrides": {path: value}, "environ": {}}, "overrides"),
    ]
    for kwargs, source in layers:
        with pytest.raises(ConfigError) as err:
            load_config(**kwargs)
        assert err.value.where == source
        assert f"{path} = {value!r}" in err.value.problem
        assert err.value.fix


def test_good_pacs_values_pass_and_an_ae_title_is_stripped():
    cfg = load_config(overrides={"pacs.ae_title": " CTPIPE2 ", "pacs.send_to": "dimse://ORTHANC@127.0.0.1:4242"}, environ={})
    assert cfg.pacs.ae_title == "CTPIPE2" and cfg.pacs.send_to == "dimse://ORTHANC@127.0.0.1:4242"
    assert load_config(overrides={"pacs.send_to": "dicomweb+https://pacs.example.org/dicom-web"}, environ={}).pacs.send_to


def test_a_bad_send_to_stops_ctpipe_run_before_any_retrieval(tmp_path, capsys):
    rc = main(
        ["run", "dimse://PACS@127.0.0.1:1?accession=A1", "--out", str(tmp_path / "r"), "--set", "pacs.send_to=dimse://h:104"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "pacs.send_to = 'dimse://h:104'" in err and "names no AE title" in err
    assert not (tmp_path / "r" / "pacs").exists()


@pytest.fixture
def listen(tmp_path, monkeypatch, capsys):
    import pipeline.pacs.listener

    monkeypatch.setattr(pipeline.pacs.listener, "Listener", ConfigOnlyListener)
    monkeypatch.delenv("CTPIPE_RUNNER_WORKERS", raising=False)
    term = signal.getsignal(signal.SIGTERM)

    def workers(*argv: str) -> int:
        ConfigOnlyListener.seen.clear()
        assert main(["listen", "--out", str(tmp_path / "l"), "--allow", "X", *argv]) == 0
        capsys.readouterr()
        return int(ConfigOnlyListener.seen[-1].runner.workers)

    yield workers
    signal.signal(signal.SIGTERM, term)


def test_listen_workers_default_zero_yields_to_every_layer(listen, tmp_path, monkeypatch):
    assert listen() == 0  # the listener's own default (the schema's is 2)
    conf = tmp_path / "c.yaml"
    conf.write_text("runner:\n  workers: 3\n")
    assert listen("--config", str(conf)) == 3
    monkeypatch.setenv("CTPIPE_RUNNER_WORKERS", "5")
    assert listen("--config", str(conf)) == 5
    assert listen("--set", "runner.workers=4") == 4
    assert listen("--set", "runner.workers=1", "--workers", "1") == 1  # both alike: taken (a contradiction is refused)
    assert listen("--workers", "0") == 0


def test_send_to_wins_over_the_variable_and_the_config_file(tmp_path, capsys, monkeypatch):
    # was: "environment variable CTPIPE_PACS_SEND_TO: pacs.send_to = 'ftp://x': unknown scheme", exit status 1, for
    # ctpipe send --to ADDRESS, as though the variable it overrides still counted (ctpipe run --device does not so)
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    assert main(["run", str(tmp_path / "empty"), "--out", str(run), "--workers", "0"]) == 0
    monkeypatch.setenv("CTPIPE_PACS_SEND_TO", "ftp://pacs.example.org")
    rc = main(["send", str(run), "--to", "dimse://ARCHIVE@127.0.0.1:11112", "--timeout", "1"])
    out = capsys.readouterr()
    assert rc == 0 and "CTPIPE_PACS_SEND_TO" not in out.err, out.err
    assert "ARCHIVE@127.0.0.1:11112" in out.out, out.out
    monkeypatch.delenv("CTPIPE_PACS_SEND_TO")
    conf = tmp_path / "c.yaml"
    conf.write_text("pacs:\n  send_to: dimse://OTHER@127.0.0.1:104\n")
    monkeypatch.setenv("CTPIPE_PACS_SEND_TO", "dimse://VARIABLE@127.0.0.1:104")
    assert main(["send", str(run), "--config", str(conf), "--timeout", "1"]) == 0  # the variable over the file
    assert "VARIABLE@127.0.0.1:104" in capsys.readouterr().out
