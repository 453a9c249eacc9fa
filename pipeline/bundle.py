"""MONAI bundle folders: find one, read its configs and resolve the values ctpipe needs.

A bundle as MONAI's model zoo ships it::

    BUNDLE/configs/inference.json   preprocessing transforms, network_def, inferer, detector settings
    BUNDLE/configs/metadata.json    version, names of the output channels
    BUNDLE/models/model.pt          state dict of ``network_def``
    BUNDLE/models/model.ts          TorchScript network

:class:`BundleConfig` reads ``inference.json`` and answers, typed and checked, what the
loader, the detector and the segmentation stage ask of it: the preprocessing chain's
orientation, spacing (mm along RAS x, y, z), HU window (:class:`~pipeline.intensity.HUWindow`)
and size divisibility; a ``SlidingWindowInferer``; the detector's anchor generator and its
``set_box_selector_parameters`` / ``set_sliding_window_inferer`` calls; the network definition.
Values are resolved in one of two ways:

* ``evaluate=True``: with MONAI's ``ConfigParser``, as MONAI runs the bundle (``@`` references,
  ``$`` expressions, ``%`` macros);
* ``evaluate=False``: nothing in the config is run; ``@`` references are followed and a ``$`` or
  ``%`` expression is refused.

Transforms are looked up in the preprocessing chain (:data:`PREPROCESSING_KEYS`, a ``Compose``
or a plain list), or anywhere in the config when it has none of those keys. A transform counts
unless its ``_disabled_`` is literally ``true``: ctpipe resamples every series itself, so a
switch such as the LUNA16 bundle's ``"_disabled_": "@whether_resampled_luna16"`` (for data
resampled beforehand) does not turn its ``Spacingd`` off.

The bundle's file paths, its metadata and model files and the plain values returned here are
:mod:`pipeline.bundle_files`'s. Every problem raises :class:`~pipeline.errors.BundleError` naming the file and the
config key.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .bundle_files import (
    INFERENCE_JSON,
    METADATA_JSON,
    Component,
    SlidingWindow,
    int3_value,
    mm3_value,
    model_file,
    read_json,
    read_metadata,
)
from .errors import BundleError, ConfigError
from .intensity import HUWindow

if TYPE_CHECKING:
    from monai.bundle import ConfigParser

__all__ = [
    "INFERENCE_JSON",
    "METADATA_JSON",
    "PREPROCESSING_KEYS",
    "BundleConfig",
    "Component",
    "SlidingWindow",
    "model_file",
    "read_metadata",
]

#: Config keys of the preprocessing chain, in the order they are searched.
PREPROCESSING_KEYS = ("preprocessing", "test_transforms", "val_transforms", "preprocessing_transforms")

_MAX_HOPS = 10  # "@a" → "@b" → ... references followed before giving up
_REF = re.compile(r"@([A-Za-z0-9_#]+)")
# what evaluating a config value may raise (ConfigParser passes through the expression's own errors)
_VALUE_ERRORS = (KeyError, IndexError, TypeError, ValueError, SyntaxError, AttributeError, NameError)
_REQUIRED: Any = object()


class BundleConfig:
    """A bundle's ``configs/inference.json``, parsed, with typed look-ups (see the module docstring).

    ``data`` is the parsed JSON object; ``path`` the file it came from and ``root`` the bundle
    folder (``bundle_root`` in the config, and where ``models/`` is), when known.
    """

    def __init__(self, data: Mapping[str, Any], *, path: Path | None = None, root: Path | None = None, evaluate: bool = False):
        self.where = str(path) if path is not None else "bundle config"
        if not isinstance(data, Mapping):
            raise BundleError(f"bundle config must be a JSON object, got {type(data).__name__}", where=self.where)
        self.data = data
        self.path = path
        self.root = root
        self.evaluate = evaluate
        self._parser: ConfigParser | None = None

    @classmethod
    def read(cls, path: str | Path, *, evaluate: bool = False) -> BundleConfig:
        """Read ``configs/inference.json`` of the bundle folder ``path``, or the JSON file ``path``."""
        given = Path(path)
        named_file = given.suffix.lower() == ".json" and not given.is_dir()
        file = given if named_file else given / INFERENCE_JSON
        if not given.exists() and not named_file:
            raise BundleError(
                f"no such bundle folder, so its {INFERENCE_JSON} does not exist",
                where=given,
                fix="check the path; a bundle is the folder holding configs/ and models/",
            )
        if not file.is_file():
            raise BundleError(
                f"cannot read the bundle config: {file.name if named_file else INFERENCE_JSON} does not exist",
                where=given,
                fix="pass the bundle's top folder (the one holding configs/ and models/) or its configs/inference.json",
            )
        root = file.parent.parent if file.parent.name == "configs" else file.parent
        return cls(read_json(file), path=file, root=root, evaluate=evaluate)

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __repr__(self) -> str:
        return f"BundleConfig({self.where!r}, evaluate={self.evaluate})"

    # -- raw access and resolution -------------------------------------------------------------
    def _lookup(self, id: str) -> tuple[bool, Any]:
        node: Any = self.data
        for part in id.replace("::", "#").split("#"):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False, None
        return True, node

    def has(self, id: str) -> bool:
        """Whether the config holds an entry ``id`` (``"a#b#0"``: key ``a``, key ``b``, list item 0)."""
        return self._lookup(id)[0]

    def raw(self, id: str) -> Any:
        """The entry ``id`` as written (references and expressions unresolved)."""
        found, value = self._lookup(id)
        if not found:
            raise BundleError(f"config has no {id!r}", where=self.where)
        return value

    def get(self, id: str, default: Any = _REQUIRED) -> Any:
        """The entry ``id``, resolved (see the module docstring); ``default`` when there is none."""
        if not self.has(id):
            if default is _REQUIRED:
                raise BundleError(f"config has no {id!r}", where=self.where)
            return default
        if not self.evaluate:
            return self._resolve(self.raw(id), id, 0)
        try:
            return self.parser.get_parsed_content(id)
        except _VALUE_ERRORS as exc:
            raise BundleError(
                f"{id} cannot be read ({type(exc).__name__}: {str(exc)[:300]})",
                where=self.where,
                fix="check the value and the entries it refers to",
            ) from exc

    def _resolve(self, value: Any, id: str, hops: int) -> Any:
        if isinstance(value, str) and value.startswith("@"):
            found, target = self._lookup(value[1:])
            if not found:
                raise BundleError(f"{id} refers to {value!r}, which is not in the config", where=self.where)
            if hops >= _MAX_HOPS:
                raise BundleError(f"{id}: the references starting at {value!r} go more than {_MAX_HOPS} deep", where=self.where)
            return self._resolve(target, id, hops + 1)
        if isinstance(value, str) and value.startswith(("$", "%")):
            raise BundleError(
                f"{id} is an expression {value!r} that cannot be read without running it",
                where=self.where,
                fix="write its value into the config",
            )
        if isinstance(value, list):
            return [self._resolve(v, f"{id}#{n}", hops) for n, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {k: self._resolve(v, f"{id}#{k}", hops) for k, v in value.items()}
        return value

    @property
    def parser(self) -> ConfigParser:
        """MONAI's ``ConfigParser`` on this config, ``bundle_root`` set to the bundle folder."""
        if self._parser is None:
            from monai.bundle import ConfigParser

            parser = ConfigParser()
            parser.read_config(copy.deepcopy(dict(self.data)))
            if self.root is not None:
                parser["bundle_root"] = str(self.root)
            self._parser = parser
        return self._parser

    def instantiate(self, id: str, *, fix: str | None = None) -> Any:
        """Build the component ``id`` (e.g. ``"network_def"``) with MONAI's ``ConfigParser``."""
        if not self.evaluate:
            raise BundleError(f"{id} can only be built from a config read with evaluate=True", where=self.where)
        if not self.has(id):
            raise BundleError(f"config has no {id!r}", where=self.where, fix=fix)
        try:
            return self.parser.get_parsed_content(id, instantiate=True)
        except Exception as exc:  # noqa: BLE001 - ConfigParser wraps any constructor error in a bare Exception/RuntimeError
            raise BundleError(
                f"{id} cannot be built ({type(exc).__name__}: {str(exc)[:300]})", where=self.where, fix=fix
            ) from exc

    # -- components ----------------------------------------------------------------------------
    def components(self) -> Iterator[Component]:
        """Every ``{"_target_": ...}`` entry of the config, depth first in file order."""
        stack: list[tuple[str, Any]] = [("", self.data)]
        while stack:
            id, node = stack.pop()
            children: list[tuple[str, Any]] = []
            if isinstance(node, Mapping):
                if "_target_" in node:
                    yield Component(id, str(node["_target_"]).rsplit(".", 1)[-1], node)
                children = [(f"{id}#{k}" if id else str(k), v) for k, v in node.items()]
            elif isinstance(node, list):
                children = [(f"{id}#{n}" if id else str(n), v) for n, v in enumerate(node)]
            stack.extend(reversed(children))

    def component(self, *names: str) -> Component | None:
        """The first component anywhere in the config whose class is one of ``names``."""
        return next((c for c in self.components() if c.name in names), None)

    def transforms(self) -> list[Component]:
        """The preprocessing transforms (see the module docstring), disabled ones included."""
        keys = [key for key in PREPROCESSING_KEYS if key in self.data]
        if not keys:
            return list(self.components())
        out: list[Component] = []
        for key in keys:
            node, base = self.data[key], key
            if isinstance(node, Mapping):
                node, base = node.get("transforms", []), f"{key}#transforms"
            if isinstance(node, list):
                out.extend(
                    Component(f"{base}#{n}", str(t["_target_"]).rsplit(".", 1)[-1], t)
                    for n, t in enumerate(node)
                    if isinstance(t, Mapping) and "_target_" in t
                )
        return out

    def transform(self, *names: str) -> Component | None:
        """The first enabled preprocessing transform whose class is one of ``names``."""
        return next((c for c in self.transforms() if c.name in names and c.args.get("_disabled_") is not True), None)

    def arg(self, component: Component, key: str, default: Any = _REQUIRED) -> Any:
        """Argument ``key`` of ``component``, resolved; ``default`` when it is not given."""
        if key not in component.args and default is _REQUIRED:
            raise BundleError(f"{component.name} ({component.id}) has no {key!r}", where=self.where)
        return self.get(f"{component.id}#{key}", default)

    # -- what ctpipe needs ---------------------------------------------------------------------
    def require_ras(self) -> None:
        """Refuse a preprocessing chain that orients the image to anything but RAS (MONAI's default)."""
        c = self.transform("Orientationd", "Orientation")
        if c is None:
            return
        codes = str(self.arg(c, "axcodes", "RAS"))
        if codes.upper() != "RAS":
            raise BundleError(
                f"{c.name}.axcodes ({c.id}#axcodes) is {codes!r}; only 'RAS' is supported",
                where=self.where,
                fix="use a bundle whose preprocessing has Orientationd(axcodes='RAS')",
            )

    def spacing(self) -> tuple[float, float, float] | None:
        """``Spacingd``'s ``pixdim``: the model's voxel size in mm along RAS x, y, z; None without one."""
        c = self.transform("Spacingd", "Spacing")
        if c is None:
            return None
        return mm3_value(self.arg(c, "pixdim"), f"{c.name}.pixdim ({c.id}#pixdim)", self.where)

    def hu_window(self) -> HUWindow | None:
        """``ScaleIntensityRanged``'s window (``b_min``/``b_max`` 0/1 and ``clip`` false when not given); None without one."""
        c = self.transform("ScaleIntensityRanged", "ScaleIntensityRange")
        if c is None:
            return None
        a_min, a_max = self.arg(c, "a_min"), self.arg(c, "a_max")
        b_min, b_max, clip = self.arg(c, "b_min", 0.0), self.arg(c, "b_max", 1.0), self.arg(c, "clip", False)
        try:
            return HUWindow(a_min, a_max, b_min, b_max, bool(clip))
        except ConfigError as exc:
            raise BundleError(f"{c.name} ({c.id}): {exc.problem}", where=self.where) from exc

    def size_divisible(self) -> tuple[int, int, int] | None:
        """The network's input size divisibility (x, y, z): ``size_divisible`` at the top level, in
        ``network_def`` or ``detector``, else ``DivisiblePadd``'s ``k``; None when the config sets none."""
        for id in ("size_divisible", "network_def#size_divisible", "detector#size_divisible"):
            if self.has(id):
                return int3_value(self.get(id), id, self.where)
        c = self.transform("DivisiblePadd", "DivisiblePad")
        if c is None:
            return None
        return int3_value(self.arg(c, "k"), f"{c.name}.k ({c.id}#k)", self.where)

    def sliding_window_inferer(self) -> SlidingWindow | None:
        """The ``SlidingWindowInferer`` component's settings; None without one."""
        c = self.component("SlidingWindowInferer")
        if c is None:
            return None
        return self._sliding(
            self.arg(c, "roi_size"),
            self.arg(c, "overlap", 0.25),
            self.arg(c, "sw_batch_size", 1),
            self.arg(c, "mode", "constant"),
            f"{c.name} ({c.id})",
        )

    def anchors(self) -> dict[str, list[Any]]:
        """``anchor_generator`` (MONAI's ``AnchorGeneratorWithAnchorShape``):
        ``{"feature_map_scales": [int, ...], "base_anchor_shapes": [[x, y, z], ...]}`` in voxels."""
        raw = self.raw("anchor_generator")
        target = raw.get("_target_") if isinstance(raw, Mapping) else None
        if "AnchorGeneratorWithAnchorShape" not in str(target):
            raise BundleError(f"anchor generator {target!r} is not AnchorGeneratorWithAnchorShape", where=self.where)
        scales = self.get("anchor_generator#feature_map_scales")
        shapes = self.get("anchor_generator#base_anchor_shapes")
        try:
            return {"feature_map_scales": [int(v) for v in scales], "base_anchor_shapes": [[float(x) for x in s] for s in shapes]}
        except (TypeError, ValueError) as exc:
            raise BundleError(
                f"anchor_generator: feature_map_scales {scales!r} / base_anchor_shapes {shapes!r} are not numbers ({exc})",
                where=self.where,
            ) from exc

    def detector_call(self, method: str) -> dict[str, Any] | None:
        """Keyword arguments of the ``$@detector.<method>(...)`` entries of ``detector_ops`` (merged in order,
        ``@`` references resolved); None when there is no such call."""
        ops = self.data.get("detector_ops", [])
        call = re.compile(rf"\.{re.escape(method)}\((.*)\)\s*$")
        out: dict[str, Any] | None = None
        for n, op in enumerate(ops if isinstance(ops, list) else [ops]):
            m = call.search(str(op))
            if m:
                out = {**(out or {}), **self._call_kwargs(m.group(1), f"detector_ops#{n}")}
        return out

    def box_selector(self) -> dict[str, Any]:
        """The detector's ``set_box_selector_parameters`` arguments (empty when the config sets none)."""
        return self.detector_call("set_box_selector_parameters") or {}

    def detector_sliding_window(self) -> SlidingWindow:
        """The detector's ``set_sliding_window_inferer`` settings; the patch size is ``infer_patch_size``
        when the call does not give one."""
        args = self.detector_call("set_sliding_window_inferer") or {}
        if "roi_size" in args:
            roi = args["roi_size"]
        elif self.has("infer_patch_size"):
            roi = self.get("infer_patch_size")
        else:
            raise BundleError("config sets no sliding-window roi_size nor infer_patch_size", where=self.where)
        return self._sliding(
            roi,
            args.get("overlap", 0.25),
            args.get("sw_batch_size", 1),
            args.get("mode", "constant"),
            "set_sliding_window_inferer",
        )

    def _sliding(self, roi: Any, overlap: Any, batch: Any, mode: Any, key: str) -> SlidingWindow:
        try:
            ov, nb = float(overlap), int(batch)
        except (TypeError, ValueError):
            ov, nb = -1.0, 0
        if not 0.0 <= ov < 1.0 or nb < 1:
            raise BundleError(
                f"{key}: overlap {overlap!r} must be in [0, 1) and sw_batch_size {batch!r} at least 1", where=self.where
            )
        return SlidingWindow(
            roi_size=int3_value(roi, f"{key} roi_size", self.where), overlap=ov, sw_batch_size=nb, mode=str(mode)
        )

    def _call_kwargs(self, text: str, id: str) -> dict[str, Any]:
        """``a=1, b=@ref`` → ``{"a": 1, "b": <ref's value>}``; values must be literals or references."""
        refs: dict[str, Any] = {}

        def sub(match: re.Match[str]) -> str:
            name = f"__ref{len(refs)}"
            refs[name] = self.get(match.group(1))
            return name

        try:
            call = ast.parse(f"f({_REF.sub(sub, text)})", mode="eval").body
            if not isinstance(call, ast.Call):  # pragma: no cover - "f(...)" always parses to a call
                raise ValueError("not a call")
            out: dict[str, Any] = {}
            for kw in call.keywords:
                node = kw.value
                if kw.arg is None:
                    raise ValueError("**arguments cannot be read")
                out[kw.arg] = refs[node.id] if isinstance(node, ast.Name) and node.id in refs else ast.literal_eval(node)
        except (SyntaxError, ValueError) as exc:
            raise BundleError(
                f"{id}: the call's arguments cannot be read ({exc})",
                where=self.where,
                fix="write them as literals or @references",
            ) from exc
        return out
