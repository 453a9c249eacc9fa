"""One vocabulary of device names: ctpipe detect and reconstruct, ctpipe run and listen, run_batch and the notebook
API read the same names (``gpu`` as ``cuda``, any case) and each refusal lists them all."""

from __future__ import annotations

import argparse
import signal

import numpy as np
import pytest

from pipeline.argtypes import device_name
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import ConfigError, LoaderError
from pipeline.load.base import resolve_device
from tests._support.cli import ConfigOnlyListener
from tests._support.cli import cli_error as _err

#: Each name every command reads, and the one torch and the runner read for it.
NAMES = {"auto": "auto", "cpu": "cpu", "CPU": "cpu", "gpu": "cuda", "GPU": "cuda", "cuda": "cuda", " Cuda:1 ": "cuda:1"}


@pytest.mark.parametrize("name", sorted(NAMES), ids=lambda name: f"name={name.strip()}")  # an id "gpu" is the gpu mark
def test_every_command_reads_a_device_name_as_the_others_do(name, monkeypatch):
    # was: ctpipe detect --device gpu ran on the GPU, ctpipe run --device gpu and run_batch(device="gpu") were refused
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    assert device_name(name) == NAMES[name]  # ctpipe detect and reconstruct
    assert load_config(overrides={"device": name}, environ={}).runner.device == NAMES[name]  # run, listen, run_batch
    assert load_config(environ={"CTPIPE_RUNNER_DEVICE": name}).runner.device == NAMES[name]


def _names_listed(text: str) -> bool:
    return all(word in text for word in ("auto", "cpu", "gpu", "cuda", "cuda:N"))


def test_every_refusal_of_a_device_lists_the_same_names(monkeypatch):
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        device_name("tpu")
    with pytest.raises(ConfigError) as config:
        load_config(overrides={"device": "tpu"}, environ={})
    with pytest.raises(LoaderError) as api:
        resolve_device("tpu", where="device")
    for err in (cli, config, api):
        assert "'tpu'" in str(err.value) and _names_listed(str(err.value)), str(err.value)


def test_run_and_listen_take_gpu_from_the_command_line(tmp_path, monkeypatch, capsys):
    import pipeline.pacs.listener

    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    monkeypatch.setattr(pipeline.pacs.listener, "Listener", ConfigOnlyListener)
    term = signal.getsignal(signal.SIGTERM)
    try:
        ConfigOnlyListener.seen.clear()
        assert main(["listen", "--out", str(tmp_path / "l"), "--allow", "X", "--device", "GPU"]) == 0
        assert ConfigOnlyListener.seen[-1].runner.device == "cuda"
    finally:
        signal.signal(signal.SIGTERM, term)
    (tmp_path / "empty").mkdir()  # no series: no model to place, so the run ends whether or not a GPU is here
    rc, err = _err(capsys, "run", str(tmp_path / "empty"), "--out", str(tmp_path / "r"), "--device", "gpu")
    assert rc == 0, err
    assert "device: cuda  # from --device" in (tmp_path / "r" / "config.yaml").read_text()
    rc, err = _err(capsys, "run", str(tmp_path / "empty"), "--out", str(tmp_path / "r2"), "--device", "tpu")
    assert rc == 2 and "--device: runner.device = 'tpu' is not allowed" in err and _names_listed(err), err


@pytest.mark.parametrize("number", [0, 1, np.int64(1)], ids=["0", "1", "numpy-1"])
def test_a_gpu_number_from_python_is_that_gpu_for_run_batch_as_for_detect(number, monkeypatch):
    # was: detect(vol, device=1) ran on cuda:1, run_batch(device=1) was refused as "allowed: a string"
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert resolve_device(number, where="device") == f"cuda:{int(number)}"  # detect and reconstruct
    assert load_config(overrides={"device": number}, environ={}).runner.device == f"cuda:{int(number)}"  # run_batch


@pytest.mark.parametrize("value", [-1, True, 1.5, [0, 1]], ids=["negative", "bool", "float", "list"])
def test_what_is_neither_a_device_name_nor_a_gpu_number_is_refused_with_the_names(value, monkeypatch):
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"device": value}, environ={})
    assert f"runner.device = {value!r} is not allowed" in str(err.value) and _names_listed(str(err.value))
    assert "GPU number" in str(err.value) and err.value.fix
