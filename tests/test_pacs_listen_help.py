"""What ``ctpipe listen --help`` tells a PACS administrator before the first sender is configured: the AE title
senders must address, that by default only senders on this machine reach it (and what to bind for others), and every
reason it exits with status 1 at its start (a run folder another ctpipe process holds; results made otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.cli import main
from tests._support.orthanc import free_port
from tests.test_cli_help import _commands

ROOT = Path(__file__).resolve().parents[1]


def _help() -> str:
    return " ".join(_commands()["listen"].format_help().split())


def test_the_help_says_which_ae_title_senders_address_and_where_it_listens():
    # was: only the calling AE titles (--allow), nothing of the called one; --bind "default 127.0.0.1" alone, which
    # leaves a modality on another machine refused by the operating system with nothing in the listener's log
    text = _help()
    for stated in (
        "addressing it by its own AE title (--ae-title; pacs.check_called_aet)",
        "It listens on 127.0.0.1 (this machine only) unless --bind names another address",
        "0.0.0.0, or this machine's address on their network, senders on other machines",
    ):
        assert stated in text, stated


def test_a_run_folder_another_listener_holds_exits_1_as_the_help_says(tmp_path, capsys):
    # was: exit status 1 named only a bad configuration or an address or port it cannot listen on
    assert "a run folder another ctpipe process is fetching into or listening for" in _help()
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "listen", "--out", str(run), "--allow", "MOD", "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert first.stdout is not None
        said = [first.stdout.readline() for _ in range(1)]
        while said[-1] and not said[-1].startswith("listening as"):  # its "listening as ...": the folder is held
            said.append(first.stdout.readline())
        assert said[-1].startswith("listening as"), said
        rc = main(["listen", "--out", str(run), "--allow", "MOD", "--port", str(free_port())])
        err = capsys.readouterr().err
        assert rc == 1 and "another ctpipe process" in err and "listening for this run folder" in err, (rc, err)
    finally:
        first.terminate()
        first.wait(timeout=60)
