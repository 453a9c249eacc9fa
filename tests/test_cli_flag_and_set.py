"""An option given both by a flag and by ``--set`` on one command line: taken when both give it alike, refused (exit
status 2, naming both spellings, the option and the fix) when they contradict, in every command that has both."""

from __future__ import annotations

import pytest

from tests._support.cli import cli_error

A = "dicomweb+http://127.0.0.1:8042/dicom-web"
B = "dimse://PACS@127.0.0.1:104"

#: (command, flag arguments, option, a --set value that contradicts them, a --set value that says the same)
CASES = [
    ("run", ["--workers", "4"], "runner.workers", "2", "4"),
    ("run", ["--device", "cpu"], "runner.device", "cuda", "CPU"),
    ("run", ["--bundle", "b1"], "detector.bundle", "b2", "b1"),
    ("run", ["--metrics-port", "9100"], "metrics.port", "null", "9100"),
    ("run", ["--retry-failed"], "runner.retry_failed", "false", "true"),
    ("run", ["--keep-identifiers"], "privacy.keep_identifiers", "false", "true"),
    ("run", ["--dicom", "sr,seg"], "outputs.dicom", "sr", "[seg, sr]"),
    ("run", ["--no-dicom"], "outputs.dicom", "seg", "none"),
    ("run", ["--ray"], "runner.engine", "local", "ray"),
    ("run", ["--ray", "10.0.0.1:6379"], "runner.ray_address", "auto", "10.0.0.1:6379"),
    ("listen", ["--ae-title", "CTPIPE1"], "pacs.ae_title", "CTPIPE2", "CTPIPE1"),
    ("listen", ["--bind", "0.0.0.0"], "pacs.bind", "127.0.0.1", "0.0.0.0"),
    ("listen", ["--port", "11112"], "pacs.port", "11113", "11112"),
    ("listen", ["--allow", "MOD1", "--allow", "MOD2"], "pacs.allowed_aets", "[MOD1]", "[MOD2, MOD1]"),
    ("listen", ["--quiet-period", "30"], "pacs.quiet_period_s", "60", "30.0"),
    ("listen", ["--send-to", A], "pacs.send_to", B, A),
    ("listen", ["--device", "cpu"], "runner.device", "cuda:0", "cpu"),
    ("listen", ["--bundle", "b1"], "detector.bundle", "b2", "b1"),
    ("listen", ["--workers", "0"], "runner.workers", "2", "0"),
    ("send", ["--to", A], "pacs.send_to", B, A),
]

#: an item whose value is refused once the command line's options are taken: the command stops there, before any work
STOP = "--set=runner.retries=-1"


def _argv(tmp_path, command: str) -> list[str]:
    if command == "run":
        return ["run", str(tmp_path / "src"), "--out", str(tmp_path / "out")]
    if command == "listen":
        return ["listen", "--out", str(tmp_path / "out")]
    return ["send", str(tmp_path / "out")]


@pytest.mark.parametrize(("command", "flag", "option", "other", "same"), CASES, ids=lambda v: str(v))
def test_a_flag_and_a_set_of_the_same_option(tmp_path, capsys, command, flag, option, other, same):
    item = f"--set {option}={other}"
    rc, err = cli_error(capsys, *_argv(tmp_path, command), *flag, "--set", f"{option}={other}", STOP)
    assert rc == 2, err  # was: the flag won without a word, the --set item dropped
    assert f"error: {flag[0]} and {item}: both set {option}" in err, err
    assert f"Fix: give it once: either {flag[0]} or {item}, not both" in err, err
    assert not (tmp_path / "out").exists()

    for before in (True, False):  # both saying the same: taken, in either order; the command goes on to STOP
        pair = [*flag, "--set", f"{option}={same}"] if before else ["--set", f"{option}={same}", *flag]
        rc, err = cli_error(capsys, *_argv(tmp_path, command), *pair, STOP)
        assert rc == 2 and "--set runner.retries=-1: runner.retries = -1 is not allowed" in err, err
        assert "both set" not in err


@pytest.mark.parametrize("command", ["run", "listen", "send"])
def test_two_set_items_of_the_same_option(tmp_path, capsys, command):
    first, other, bad = "--set runner.retries=2", "--set runner.retries=3", "--set runner.retries=2.0e0"
    rc, err = cli_error(capsys, *_argv(tmp_path, command), *first.split(), *other.split(), STOP)
    assert rc == 2, err  # was: the last one won without a word
    assert f"error: {first} and {other}: both set runner.retries, to 2 and to 3" in err, err
    assert f"Fix: give it once: either {first} or {other}, not both" in err, err
    rc, err = cli_error(capsys, *_argv(tmp_path, command), *first.split(), "--set", "runner.retries=2", STOP)
    assert rc == 2 and "--set runner.retries=-1: runner.retries = -1 is not allowed" in err, err  # alike: taken
    rc, err = cli_error(capsys, *_argv(tmp_path, command), *first.split(), *bad.split())
    assert "both set" not in err and "runner.retries = '2.0e0' is not allowed" in err, err  # a bad value: named as such
