"""ctpipe configuration: one option's value checked against its :class:`~pipeline.config_schema.Option`.

:func:`check_value` validates a value read from any source (override, environment variable, YAML file, default)
by the option's kind and allowed values, and returns it as the runner reads it (an ``int`` for
``numpy.int64(4)``, ``cuda:1`` for a GPU number, a float for ``1e3``). A bad value raises
:class:`~pipeline.errors.ConfigError` naming the key's dotted path, the value, where it came from and what
is allowed.
"""

from __future__ import annotations

import numbers
import os
import re
from typing import Any

from . import devices
from .argtypes import as_choice
from .config_schema import Option
from .errors import ConfigError, PacsAddressError
from .pacs.address import check_aet, parse_destination, redact

#: A decimal number in exponent notation without YAML 1.1's dot and sign (``1e3``, ``2E-2``, ``1.5e3``): YAML 1.2 and
#: every programming language read it as a number, PyYAML as a string.
_EXPONENT_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def allowed_values(path: str, opt: Option) -> str:
    """What the option ``path`` takes, as its errors say it: :meth:`Option.allowed`, but the device names for
    ``runner.device`` (a str option whose names are checked apart)."""
    return devices.allowed_devices(several=True) if path == "runner.device" else opt.allowed()


def check_value(path: str, opt: Option, value: Any, source: str) -> Any:
    def bad(extra: str = "") -> ConfigError:
        allowed = allowed_values(path, opt)
        return ConfigError(
            f"{path} = {value!r} is not allowed{extra}; allowed: {allowed}",
            where=source,
            fix=f"set {path} to {allowed} (see configs/default.yaml)",
        )

    if value is None:
        if opt.nullable:
            return None
        raise bad()
    k = opt.kind
    if k == "bool":
        if isinstance(value, bool):
            return value
        raise bad()
    if k == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise bad()
        value = int(value)  # numpy.int64(4), from a notebook's arithmetic: a plain int, as the saved config.yaml holds it
    elif k == "float":
        if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
            value = float(value)  # 1e3, 2E-2: numbers that YAML 1.1 (PyYAML) leaves as strings
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad()
        value = float(value)
        if value != value:  # NaN
            raise bad()
    if k in ("int", "float"):
        if (opt.lo is not None and value < opt.lo) or (opt.hi is not None and value > opt.hi):
            raise bad(" (out of range)")
        return value
    if k == "choice":
        choice = as_choice(value, opt.choices)
        if choice is None:
            raise bad()
        return choice
    if k == "choices":
        if isinstance(value, str) and value.strip().lower() == "none":
            value = []
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad()
        chosen = [as_choice(v, opt.choices) for v in value]
        if any(c is None for c in chosen):
            raise bad()
        return list(dict.fromkeys(chosen))
    if k == "strs":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
            raise bad()
        return list(dict.fromkeys(v.strip() for v in value))
    if path == "runner.device" and not isinstance(value, (str, os.PathLike)):
        value = _device_number(value, path, source)
    if k in ("str", "path"):
        if not isinstance(value, (str, os.PathLike)):
            raise bad()
        value = str(value)
        if k == "path":
            _check_home(value, path, source)
        if path == "runner.device":
            value = _check_device(value, path, source)
        if path == "runner.ray_address":
            value = _check_ray_address(value, path, source)
        if path == "pacs.ae_title":
            value = _check_pacs(check_aet, value, path, source)
        if path == "pacs.send_to":
            _check_pacs(parse_destination, value, path, source)
        if path == "metrics.textfile_name":
            _check_textfile_name(value, path, source)
        return value
    raise AssertionError(k)


def _check_home(value: str, path: str, source: str) -> None:
    """A path option written with a leading ``~`` (``~/data``): a shell expands it, a config file, a variable or
    Python do not, so it would name a folder ``~`` in the working folder (and the error, "does not exist", a folder
    the user sees in the home folder). Refused with the path in full, unless the working folder has such a folder."""
    expanded = os.path.expanduser(value)
    if not value.startswith("~") or expanded == value or os.path.isdir(value.split(os.sep, 1)[0]):
        return
    raise ConfigError(
        f"{path} = {value!r} starts with '~', which is not expanded here (a shell expands it, a config file, a "
        f"CTPIPE_* variable or Python do not)",
        where=source,
        fix=f"write the path in full: {path} = {expanded}",
    )


def _device_number(value: Any, path: str, source: str) -> str:
    """A GPU number given from Python or a file (``device=1``) as the name every other device option reads it
    (:func:`pipeline.devices.gpu_number_name`: ``cuda:1``); anything else not text is refused with the device names."""
    name = devices.gpu_number_name(value)
    if name is None:
        raise ConfigError(
            f"{path} = {value!r} is not allowed; allowed: {devices.allowed_devices(several=True)}, or a GPU number "
            f"(0 or more) from Python",
            where=source,
            fix="pick one of these, e.g. auto, cuda:0 or the GPU number 0",
        )
    return name


def _check_device(text: str, path: str, source: str) -> str:
    """The device name of ``text`` as the runner reads it (:func:`pipeline.devices.device_name`: ``gpu`` is ``cuda``,
    lower case): ``auto``, ``cpu``, ``cuda`` or ``cuda:N[,M...]``: GPU numbers, each once (one model worker per GPU)."""
    value = devices.device_name(text, several=True)
    if value is None:
        raise ConfigError(
            f"{path} = {text!r} is not allowed; allowed: {devices.allowed_devices(several=True)}",
            where=source,
            fix="pick one of these, e.g. auto or cuda:0",
        )
    if value.startswith("cuda:"):
        ids = value[5:].split(",")
        if "" in ids:
            raise ConfigError(
                f"{path} = {text!r} has an empty GPU number between its commas",
                where=source,
                fix="list the GPU numbers with one comma between each, e.g. cuda:0,1",
            )
        twice = sorted({int(i) for i in ids if [int(j) for j in ids].count(int(i)) > 1})
        if twice:
            raise ConfigError(
                f"{path} = {text!r} names GPU {', '.join(map(str, twice))} twice: each GPU gets one model worker",
                where=source,
                fix=f"name each GPU once, e.g. cuda:{','.join(dict.fromkeys(str(int(i)) for i in ids))}",
            )
    return value


def _check_textfile_name(value: str, path: str, source: str) -> None:
    """node_exporter's textfile collector reads only ``*.prom`` files of its folder: a plain name ending in .prom."""
    if not value.endswith(".prom") or value == ".prom" or "/" in value or "\\" in value or value.startswith("."):
        raise ConfigError(
            f"{path} = {value!r} is not allowed; allowed: a file name ending in .prom, without a folder",
            where=source,
            fix="name the file after the job, e.g. ctpipe-nightly.prom (node_exporter reads only *.prom files; the "
            "folder is metrics.textfile_dir)",
        )


def _check_ray_address(value: str, path: str, source: str) -> str:
    """``value`` when it is HOST:PORT, or ``auto`` or ``local`` in any letter case (as they are spelt); else the error."""
    word = as_choice(value, ("auto", "local"))
    if word is not None:
        return word
    host, sep, port = value.rpartition(":")
    ok = bool(sep) and bool(host.strip("[]")) and port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise ConfigError(
            f"{path} = {value!r} is not allowed; allowed: auto, local or HOST:PORT of the Ray head (e.g. 10.0.0.5:6379)",
            where=source,
            fix="give the address `ray start --head` printed, or auto on a machine of the cluster",
        )
    return value


def _check_pacs(check: Any, value: str, path: str, source: str) -> str:
    """``check(value, where)`` (an AE title or a PACS address check of :mod:`pipeline.pacs.address`) with its
    :class:`PacsAddressError` turned into a :class:`ConfigError` naming the option; the checked value (an AE title
    stripped)."""
    try:
        checked = check(value, where=path)
    except PacsAddressError as exc:
        raise ConfigError(f"{path} = {redact(value)!r}: {exc.problem}", where=source, fix=exc.fix) from exc
    return checked if isinstance(checked, str) else value
