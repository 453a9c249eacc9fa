"""ctpipe configuration: validation and precedence of sources.

Every option lives in a section of :data:`~pipeline.config_schema.SCHEMA` (its default, type, unit and
allowed values; documented with its unit in ``configs/default.yaml``). Values come from, highest precedence
first:

1. explicit overrides (CLI flags, keyword arguments of :func:`pipeline.run_batch`),
2. environment variables ``CTPIPE_<SECTION>_<KEY>`` (e.g. ``CTPIPE_RUNNER_WORKERS=4``),
3. a YAML config file,
4. the defaults of :mod:`pipeline.config_schema`.

Every value is validated when read: an unknown key or a bad value raises
:class:`~pipeline.errors.ConfigError` naming the key's dotted path, the value
and what is allowed.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config_check import allowed_values, check_value
from .config_schema import ALIASES, SCHEMA, defaults
from .errors import ConfigError, missing_path_fix, require_path


def _refuse_change(path: str, value: Any, *, delete: bool = False) -> None:
    """A loaded configuration is read-only: raise AttributeError naming what was to be set and how to give it."""
    if delete:
        what, fix = f"delete {path}", "leave it out of the overrides to keep its default"
    elif "." in path:
        what, fix = f"set {path} to {value!r}", f"load_config(overrides={{{path!r}: {value!r}}}) or --set {path}={value}"
    else:
        what, fix = (
            f"replace the section {path!r}",
            f"load_config(overrides={{'{path}.OPTION': VALUE}}) or --set {path}.OPTION=VALUE",
        )
    raise AttributeError(f"the configuration is read-only: cannot {what}. Fix: give the value when loading it, {fix}")


class Section(Mapping[str, Any]):
    """Read-only view of one section; options are attributes: ``cfg.runner.workers``."""

    def __init__(self, name: str, values: Mapping[str, Any]):
        self._name = name
        self._values = dict(values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_values"][key]
        except KeyError:
            raise AttributeError(f"config section {self.__dict__.get('_name')!r} has no option {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        if "_values" in self.__dict__:
            _refuse_change(f"{self._name}.{key}", value)
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        _refuse_change(f"{self._name}.{key}", None, delete=True)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"{self._name}: {self._values}"


class Config(Mapping[str, Section]):
    """A validated, read-only configuration (see the module docstring for precedence)."""

    def __init__(self, data: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str] | None = None):
        self._sections = {name: Section(name, data[name]) for name in SCHEMA}
        self.sources: dict[str, str] = dict(sources or {})

    def __getattr__(self, name: str) -> Section:
        try:
            return self.__dict__["_sections"][name]
        except KeyError:
            raise AttributeError(f"config has no section {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if "sources" in self.__dict__:  # set last in __init__
            _refuse_change(name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        _refuse_change(name, None, delete=True)

    def __getitem__(self, name: str) -> Section:
        return self._sections[name]

    def __iter__(self):
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def get_path(self, dotted: str) -> Any:
        section, key = dotted.split(".", 1)
        return self._sections[section][key]

    def source_of(self, dotted: str) -> str:
        """Where the option ``dotted`` (``section.option``) was set, for an error about its value to name: the flag or
        ``--set`` item (``--device``, ``--set runner.device=cuda:1``), ``environment variable CTPIPE_RUNNER_DEVICE``,
        the config file's path, ``the command's defaults``; ``dotted`` itself where nothing set it (its default). A
        source that does not name the option itself (a file, a command's defaults, a caller's overrides) is followed by
        it (``/etc/ctpipe.yaml: runner.device``), so that an error's text need not name it too."""
        source = self.sources.get(dotted)
        if source is None:
            return dotted
        if source.startswith(("--", "environment variable ")):
            return source
        return f"{source}: {dotted}"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: copy.deepcopy(dict(sec)) for name, sec in self._sections.items()}

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{n}={dict(s)}" for n, s in self._sections.items()) + ")"


def _merge(
    data: dict, layer: Mapping[str, Any], source: str, sources: dict[str, str], labels: Mapping[str, str] | None = None
) -> None:
    """Validate ``layer`` into ``data``, recording each option's source: ``labels[path]`` where given (e.g. the
    ``--set`` item that set the option ``path``), else ``source``; errors name the same."""
    labels = labels or {}
    if not isinstance(layer, Mapping):
        raise ConfigError(
            f"the top level must be a mapping of sections, got {type(layer).__name__}",
            where=source,
            fix="write sections such as 'runner:' with options indented below them",
        )
    for sec, values in layer.items():
        if sec not in SCHEMA:
            named = [labels[f"{sec}.{k}"] for k in values if f"{sec}.{k}" in labels] if isinstance(values, Mapping) else []
            raise ConfigError(
                f"unknown section {sec!r}; allowed: {', '.join(SCHEMA)}",
                where=named[0] if named else source,
                fix="remove or rename it",
            )
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"section {sec} must be a mapping of options, got {values!r}",
                where=source,
                fix=f"indent the options of {sec} below it, one 'option: value' a line (see configs/default.yaml)",
            )
        for key, value in values.items():
            path = f"{sec}.{key}"
            where = labels.get(path, source)
            opt = SCHEMA[sec].get(key)
            if opt is None:
                likely = likely_option(sec, str(key))  # a YAML key may be a number (runner: {1: 2})
                raise ConfigError(
                    f"unknown option {path!r} (value {value!r}); {f'did you mean {sec}.{likely}? ' if likely else ''}"
                    f"allowed in {sec}: {', '.join(SCHEMA[sec])}",
                    where=where,
                    fix=f"rename it to {sec}.{likely}"
                    if likely
                    else "remove it or correct its spelling (see configs/default.yaml)",
                )
            data[sec][key] = check_value(path, opt, value, where)
            sources[path] = where


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML config file (not yet validated; :func:`load_config` validates)."""
    import yaml

    p = require_path(
        path,
        where="config",
        error=ConfigError,
        what="a YAML config file",
        fix="pass the path of a YAML file (see configs/default.yaml), a Config of load_config(), or None for the defaults",
    )
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the config file ({exc.strerror})",
            where=p,
            fix=missing_path_fix(path, "check the path given to --config (config= of run_batch)"),
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not a text file (byte {exc.start} is not UTF-8)", where=p, fix="pass a YAML file, e.g. configs/default.yaml"
        ) from exc
    try:
        data = yaml.load(text, Loader=_unique_keys_loader())  # a SafeLoader
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, p) from exc
    return data or {}


def _unique_keys_loader() -> type:
    """A YAML SafeLoader refusing a key given twice in one mapping (a second ``runner:`` section, an option written
    twice), which YAML would otherwise settle silently by keeping the later one."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # "<<: *anchor": its keys may be overridden, as YAML means them to be
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is given twice (first on line {seen[key] + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _yaml_error(exc: Exception, text: str, path: Path) -> ConfigError:
    """The YAML parser's complaint as one line naming the line and column (tabs, the usual culprit, said plainly)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return ConfigError(f"not valid YAML: {problem}", where=path, fix="correct the file's syntax")
    line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}"
    if "\t" in line[: mark.column + 1] or "'\\t'" in problem:
        return ConfigError(
            "not valid YAML: a tab character where YAML allows only spaces (indentation)",
            where=where,
            fix="indent with spaces instead of tabs (e.g. expand -t 2 FILE)",
        )
    context = getattr(exc, "context", None)
    return ConfigError(
        f"not valid YAML: {problem}" + (f" ({context})" if context else "") + (f": {line.strip()!r}" if line.strip() else ""),
        where=where,
        fix="correct the file's syntax (see configs/default.yaml)",
    )


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Options set through ``CTPIPE_<SECTION>_<KEY>`` variables (values parsed as YAML scalars)."""
    import yaml

    env = os.environ if environ is None else environ
    layer: dict[str, dict[str, Any]] = {}
    for name, raw in env.items():
        if not name.startswith("CTPIPE_"):
            continue
        rest = name[len("CTPIPE_") :].lower()
        sec = next((s for s in SCHEMA if rest.startswith(s + "_")), None)
        if sec is None:
            _refuse_misspelt_option(name)
            continue  # other CTPIPE_* variables are not configuration
        key = rest[len(sec) + 1 :]
        if key not in SCHEMA[sec]:
            likely = likely_option(sec, key)
            right = f"CTPIPE_{sec}_{likely}".upper() if likely else None
            raise ConfigError(
                f"unknown option '{sec}.{key}' (value {raw!r}); {f'did you mean {right}, option {sec}.{likely}? ' if likely else ''}"
                f"allowed in {sec}: {', '.join(SCHEMA[sec])}",
                where=f"environment variable {name}",
                fix=f"rename it to {right}, or unset it" if right else "unset it or correct its name",
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        layer.setdefault(sec, {})[key] = value
    return layer


def _empty_variable(name: str, sec: str, key: str) -> ConfigError:
    """The error for the variable ``name`` set to nothing (``CTPIPE_RUNNER_DEVICE=``, a shell line or a service file
    that meant to leave it out) for an option that takes no null: it reads as null, which the option refuses."""
    opt = SCHEMA[sec][key]
    allowed = allowed_values(f"{sec}.{key}", opt)
    return ConfigError(
        f"set but empty: {sec}.{key} takes {allowed}",
        where=f"environment variable {name}",
        fix=f"unset it (`unset {name}`) to keep the default, {sec}.{key} = {opt.default!r}, or give it a value",
    )


def likely_option(section: str, key: str) -> str | None:
    """The option of ``section`` that the unknown ``key`` most likely misspells (``wrokers`` → ``workers``), or None."""
    import difflib

    close = difflib.get_close_matches(key.lower(), list(SCHEMA[section]), n=1, cutoff=0.75)
    return close[0] if close else None


#: CTPIPE_* variables that are not options (the metrics' node label, DICOMweb credentials).
OTHER_VARIABLES = ("CTPIPE_NODE", "CTPIPE_DICOMWEB_USER", "CTPIPE_DICOMWEB_PASSWORD")


def _refuse_misspelt_option(name: str) -> None:
    """Raise :class:`ConfigError` when the variable ``name`` (no known section) reads like a misspelt option's
    variable (``CTPIPE_RUNNR_WORKERS``, ``CTPIPE_WORKERS``): silently ignored, it would leave the default in force."""
    import difflib

    if name in OTHER_VARIABLES:
        return
    known = {f"CTPIPE_{sec}_{key}".upper(): f"{sec}.{key}" for sec, opts in SCHEMA.items() for key in opts}
    rest = name[len("CTPIPE_") :].lower()
    by_key = [v for v, dotted in known.items() if dotted.split(".", 1)[1] == rest]
    close = by_key or difflib.get_close_matches(name, [*known, *OTHER_VARIABLES], n=1, cutoff=0.85)
    if close and close[0] not in OTHER_VARIABLES:
        raise ConfigError(
            f"{name} is not a ctpipe option (did you mean {close[0]}, option {known[close[0]]})",
            where=f"environment variable {name}",
            fix=f"rename it to {close[0]}, or unset it",
        )


def _dotted(key: str) -> str:
    """An override's name as ``section.option`` (``workers`` → ``runner.workers``, ``runner__workers`` too)."""
    return ALIASES.get(key, key.replace("__", "."))


def _override_labels(overrides: Mapping[str, Any], override_sources: Mapping[str, str]) -> dict[str, str]:
    """``section.option`` → the label of the override that sets it last (as :func:`overrides_layer` applies them);
    options set by an override without a label are left out (their source is ``"overrides"``)."""
    labels: dict[str, str] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in SCHEMA and isinstance(value, Mapping):
            paths = {f"{key}.{opt}": override_sources.get(f"{key}.{opt}", override_sources.get(key)) for opt in value}
        else:
            paths = {_dotted(key): override_sources.get(key)}
        for path, label in paths.items():
            if label is None:
                labels.pop(path, None)
            else:
                labels[path] = label
    return labels


def same_setting(key: str, first: tuple[str, Any], second: tuple[str, Any]) -> bool:
    """Whether two overrides of the option ``key`` (its name in ``overrides``: ``runner.workers``, ``workers``), each
    (source label, value), set it alike, as the runner reads them (``4`` and ``4``; ``"sr,seg"`` and ``["seg", "sr"]``;
    ``"GPU"`` and ``"cuda"``). A value the option does not take is a :class:`~pipeline.errors.ConfigError` naming its
    label, as :func:`load_config` gives it."""
    dotted = _dotted(key)
    sec, _, name = dotted.partition(".")
    opt = SCHEMA.get(sec, {}).get(name)
    if opt is None:
        return first[1] == second[1]
    a, b = (check_value(dotted, opt, None if value is NULL else value, label) for label, value in (first, second))
    if isinstance(a, list) and isinstance(b, list):  # a set of choices or names: the order means nothing
        return sorted(map(str, a)) == sorted(map(str, b))
    return bool(a == b)


class _Null:
    """The type of :data:`NULL`."""

    def __repr__(self) -> str:
        return "NULL"


#: An override that sets an option to null (``--set metrics.port=null``), where ``None`` means "not given".
NULL = _Null()


def overrides_layer(overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Turn ``{"workers": 4, "runner.device": "cpu", "detector": {...}}`` into sections."""
    layer: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if key in SCHEMA and isinstance(value, Mapping):
            layer.setdefault(key, {}).update(value)
            continue
        dotted = _dotted(key)
        if "." not in dotted:
            raise ConfigError(
                f"unknown override {key!r} (value {value!r}); allowed: {', '.join(ALIASES)} or 'section.option'",
                where="overrides",
                fix="use a dotted name such as runner.workers",
            )
        sec, opt = dotted.split(".", 1)
        layer.setdefault(sec, {})[opt] = value
    return layer


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    defaults_of: Mapping[str, Any] | None = None,
    override_sources: Mapping[str, str] | None = None,
) -> Config:
    """Build the effective configuration: defaults < file < environment < overrides.

    ``overrides`` with a value of ``None`` are ignored (an unset CLI flag); :data:`NULL` sets an option to null. ``defaults_of``: a command's own
    defaults (names as in ``overrides``, e.g. ``{"workers": 0}`` for ``ctpipe listen``), in force where neither
    the file, the environment nor an override sets the option. ``override_sources``: where each override came
    from, keyed by its name in ``overrides`` (e.g. ``{"runner.workers": "--set runner.workers=4", "device":
    "--device"}``): the source recorded for the option, and named by an error in its name or value (overrides
    without one: ``"overrides"``).
    """
    data = defaults()
    sources: dict[str, str] = {}
    if defaults_of:
        _merge(data, overrides_layer({k: v for k, v in defaults_of.items() if v is not None}), "the command's defaults", sources)
    if path is not None:
        _merge(data, read_file(path), str(path), sources)
    given = overrides_layer({k: None if v is NULL else v for k, v in (overrides or {}).items() if v is not None})
    labels = _override_labels(overrides or {}, override_sources or {})
    for sec, values in env_layer(environ).items():
        for key, value in values.items():
            if key in given.get(sec, {}):
                continue  # the command line (or caller) sets it: the variable does not count, whatever its value
            name = f"CTPIPE_{sec}_{key}".upper()
            if value is None and not SCHEMA[sec][key].nullable and not (os.environ if environ is None else environ)[name].strip():
                raise _empty_variable(name, sec, key)
            _merge(data, {sec: {key: value}}, f"environment variable {name}", sources)
    if given:
        _merge(data, given, "overrides", sources, labels)
    return Config(data, sources)


def from_dict(data: Mapping[str, Any], *, source: str = "saved configuration") -> Config:
    """Validate a complete or partial mapping of sections (e.g. one saved with a run)."""
    merged = defaults()
    sources: dict[str, str] = {}
    _merge(merged, data, source, sources)
    return Config(merged, sources)


def default_yaml_path() -> Path:
    """``configs/default.yaml`` of the source tree."""
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
