"""A run's configuration as :func:`~pipeline.runner.batch.run_batch` takes it (a file or a
:class:`~pipeline.config.Config`, with overrides), writes it (the run folder's ``config.yaml``) and records what it
was given (the run store's command and sources, without passwords or patient identifiers).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from ..config import Config, from_dict, load_config, overrides_layer
from ..pacs.address import for_records


def effective_config(config: str | os.PathLike[str] | Config | None, overrides: Mapping[str, Any]) -> Config:
    """The run's configuration: ``config`` (a file, or a :class:`Config` whose own sources are kept) with
    ``overrides`` (short or dotted option names, ``None`` values left out) winning over it."""
    if not isinstance(config, Config):
        return load_config(config, overrides=dict(overrides))
    if not overrides:
        return config
    merged = config.to_dict()
    given = overrides_layer({k: v for k, v in overrides.items() if v is not None})
    for sec, vals in given.items():
        merged.setdefault(sec, {}).update(vals)
    set_by = {**config.sources, **{f"{sec}.{key}": "overrides" for sec, vals in given.items() for key in vals}}
    return Config(from_dict(merged, source="overrides"), set_by)


def recorded(text: str, cfg: Config) -> str:
    """``text`` (a command line, a source) as the run store keeps it: never a password, and PACS query values that
    identify a patient (accession numbers) withheld unless ``privacy.keep_identifiers``."""
    return for_records(text, keep_identifiers=cfg.privacy.keep_identifiers)


def config_yaml(data: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> str:
    """The configuration as YAML, each option not left at its default followed by where it was set
    (``# from --workers``, ``# from environment variable CTPIPE_RUNNER_RETRIES``, ``# from FILE``)."""
    import yaml

    head = (
        "# effective configuration of the latest run (defaults < file < environment < command line);\n"
        "# an option set by a file, the environment or the command line names it\n"
    )
    lines, section = [], ""
    for line in yaml.safe_dump(json.loads(json.dumps(dict(data))), sort_keys=False).splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
        elif (key := re.match(r"  (\w+):", line)) and (where := (sources or {}).get(f"{section}.{key.group(1)}")):
            line += f"  # from {where}"
        lines.append(line)
    return head + "\n".join(lines) + "\n"
