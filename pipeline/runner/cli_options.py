"""The options of a command line's configuration: ``--set SECTION.KEY=VALUE`` items and the flags that set an option
(``--workers``, ``--device``, ``--to`` ...), as :func:`~pipeline.config.load_config` overrides with the label of each
(``"--set runner.workers=4"``, ``"--workers"``) that its errors and the run's ``config.yaml`` name. Shared by
``ctpipe run``, ``ctpipe listen`` and ``ctpipe send``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


def set_item(text: str) -> str:
    """An argparse ``type`` for ``--set``: ``text`` when it has the form ``SECTION.KEY=VALUE`` with a value, else
    an :class:`argparse.ArgumentTypeError` naming the item, what is wrong and the form, so that a malformed item is a
    bad argument (exit status 2) as any other. The value (YAML) and the option's name are checked by
    :func:`_parse_set` and :func:`load_cli_config`, bad arguments too."""
    from ..pacs.address import redact

    key, sep, value = text.partition("=")
    item = redact(text)  # as errors show it: never a password typed into an address
    form = "write it as --set section.key=value, e.g. --set runner.workers=4"
    if not sep:
        raise argparse.ArgumentTypeError(f"--set {item!r} is not SECTION.KEY=VALUE: no '='; {form}")
    if "." not in key:
        raise argparse.ArgumentTypeError(f"--set {item!r} is not SECTION.KEY=VALUE: no section before {key.strip()!r}; {form}")
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"--set {item!r} gives no value; write the value after '=' (--set section.key=value), or "
            f"--set {key.strip()}=null for none"
        )
    return text


def _parse_set(items: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--set SECTION.KEY=VALUE`` items as overrides (values parsed as YAML) and each one's source label
    (``"--set runner.workers=4"``), for :func:`~pipeline.config.load_config`'s ``overrides`` and
    ``override_sources``: it checks names and values, its errors naming the ``--set`` item. Here the syntax, and
    that an option set twice is set alike both times (``--set runner.workers=2 --set runner.workers=4`` is refused)."""
    import yaml

    from ..config import NULL
    from ..errors import UsageError
    from ..pacs.address import redact

    out: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for raw in items:
        item = redact(raw)  # as errors and the run record show it: never a password typed into an address
        key, sep, value = raw.partition("=")
        if not sep or "." not in key:
            raise UsageError(f"{item!r} is not SECTION.KEY=VALUE", where="--set", fix="e.g. --set runner.workers=4")
        if not value.strip():
            raise UsageError(
                f"{item!r} gives no value", where="--set", fix=f"write the value after '=', or {key.strip()}=null for none"
            )
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(
                f"the value {redact(value)!r} is not valid YAML ({type(exc).__name__})",
                where=f"--set {item}",
                fix="write the value as YAML, brackets closed and quotes paired, e.g. --set 'reconstruct.mesh_formats=[stl, glb]'",
            ) from exc
        parsed = NULL if parsed is None else parsed  # an explicit null, not "not given"
        if key.strip() in out:  # the same option twice: taken once when alike, else neither can be dropped
            _refuse_unless_same(key.strip(), (labels[key.strip()], out[key.strip()]), (f"--set {item}", parsed))
        out[key.strip()] = parsed
        labels[key.strip()] = f"--set {item}"
    return out, labels


def _refuse_unless_same(option: str, first: tuple[str, Any], second: tuple[str, Any]) -> None:
    """A :class:`~pipeline.errors.UsageError` naming both (label, value) settings of ``option`` given on one command
    line, unless they set it alike (:func:`~pipeline.config.same_setting`); one whose value the option does not take
    is refused for that, named by its label."""
    from ..config import same_setting
    from ..errors import ConfigError, UsageError
    from ..pacs.address import redact

    try:
        same = same_setting(option, first, second)
    except ConfigError as exc:  # a value not allowed: a bad argument, named by its flag or --set item
        raise UsageError(exc.problem, where=exc.where, fix=exc.fix) from exc
    if not same:
        raise UsageError(
            f"both set {option}, to {redact(_shown(first[1]))} and to {redact(_shown(second[1]))}",
            where=f"{first[0]} and {second[0]}",
            fix=f"give it once: either {first[0]} or {second[0]}, not both",
        )


def cli_overrides(set_items: list[str], flags: Mapping[str, tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """A command line's overrides and their source labels (for ``load_config(overrides=, override_sources=)``):
    the ``--set`` items, then ``flags`` (option name → (flag, value), a value of None: the flag not given). An option
    both a flag and a ``--set`` item give is taken when they give it alike (``--workers 4 --set runner.workers=4``);
    else a :class:`~pipeline.errors.UsageError` names both, as neither can be dropped without a word."""
    from ..config_schema import ALIASES

    overrides, labels = _parse_set(set_items)
    for name, (flag, value) in flags.items():
        if value is None:
            continue
        option = ALIASES.get(name, name)
        for key in [k for k in overrides if ALIASES.get(k, k) == option]:
            _refuse_unless_same(option, (flag, value), (labels[key], overrides[key]))
            del overrides[key], labels[key]
        overrides[name] = value
        labels[name] = flag
    return overrides, labels


def _shown(value: Any) -> str:
    """A command-line value as typed: a list as ``a,b``, an explicit null as ``null``."""
    from ..config import NULL

    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is NULL else str(value)


def load_cli_config(
    path: str | None, overrides: Mapping[str, Any], labels: Mapping[str, str], *, defaults_of: Mapping[str, Any] | None = None
) -> Any:
    """:func:`~pipeline.config.load_config` of a command line (``--config`` file ``path``, the ``overrides`` and
    ``labels`` of :func:`cli_overrides`): an option given on the command line whose name or value is not allowed
    (a ``--set`` item, a flag such as ``--device``) is a :class:`~pipeline.errors.UsageError` (exit status 2) naming
    it; one of the file or the environment stays a :class:`~pipeline.errors.ConfigError` (exit status 1)."""
    from ..config import load_config
    from ..errors import ConfigError, UsageError

    try:
        return load_config(path, overrides=overrides, override_sources=labels, defaults_of=defaults_of)
    except ConfigError as exc:
        if exc.where is not None and exc.where in set(labels.values()):
            raise UsageError(exc.problem, where=exc.where, fix=exc.fix) from exc
        raise
