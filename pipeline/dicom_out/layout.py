"""Fingerprints of how an SR's content tree and a SEG's attributes are laid out, not of what they state.

:data:`~pipeline.dicom_out.sr.SR_LAYOUT` and :data:`~pipeline.dicom_out.seg.SEG_LAYOUT` go into the instance UIDs and
are raised with each change of the layout; beside each, the fingerprint of that layout is recorded
(:data:`~pipeline.dicom_out.sr.SR_LAYOUT_FINGERPRINT`, :data:`~pipeline.dicom_out.seg.SEG_LAYOUT_FINGERPRINT`), and a
test compares it with the fingerprint of a document built now, so that the layout cannot change without its version.

SR: each content item's relationship type, value type, concept name (coding scheme and code value; not the meaning,
a label), template identifier and graphic type (SCOORD, SCOORD3D), and its children in order: no values (numbers,
texts, codes chosen, coordinates, UIDs, dates). Siblings laid out alike (each nodule's groups, the quality findings)
count once, where the first of them comes, so the fingerprint does not depend on how many there are.

SEG: the attribute keywords at every level of the dataset (the items of each sequence laid out alike counting once),
the segmentation type, and the segments' category and type codes in order (the nodules' segments, coded alike, count
once): which segments, coded how, and how the frames are described; not the pixels, positions or UIDs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

__all__ = ["seg_layout_fingerprint", "sr_layout_fingerprint"]


def _code(item: Any, keyword: str) -> str:
    seq = item.get(keyword)
    if not seq:
        return "-"
    code = seq[0]
    return f"{code.get('CodingSchemeDesignator', '')}:{code.get('CodeValue', code.get('LongCodeValue', ''))}"


def _collapse(parts: Iterable[str]) -> list[str]:
    """``parts`` in order, each counted once (where it first comes)."""
    return list(dict.fromkeys(parts))


def _content_item(item: Any) -> str:
    template = item.get("ContentTemplateSequence")
    tid = f"TID{template[0].get('TemplateIdentifier', '')}" if template else ""
    graphic = str(item.get("GraphicType", "")) if item.get("ValueType") in ("SCOORD", "SCOORD3D") else ""
    head = "|".join(
        [str(item.get("RelationshipType", "")), str(item.get("ValueType", "")), _code(item, "ConceptNameCodeSequence")]
    )
    children = _collapse(_content_item(child) for child in item.get("ContentSequence") or [])
    return f"{head}|{tid}|{graphic}(" + ",".join(children) + ")"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def sr_layout_text(dataset: Any) -> str:
    """The SR's content tree laid out as text (see the module notes): what :func:`sr_layout_fingerprint` digests,
    readable where two layouts are to be compared."""
    return _content_item(dataset)


def sr_layout_fingerprint(dataset: Any) -> str:
    """The fingerprint (16 hex digits) of an SR's content-tree layout (a pydicom dataset; see the module notes)."""
    return _digest(sr_layout_text(dataset))


def _keywords(dataset: Any) -> str:
    parts = []
    for element in dataset:
        if element.tag.is_private or not element.keyword:
            continue
        if element.VR == "SQ":
            items = _collapse(_keywords(item) for item in element.value)
            parts.append(f"{element.keyword}[" + ";".join(items) + "]")
        else:
            parts.append(element.keyword)
    return ",".join(parts)


def seg_layout_text(dataset: Any) -> str:
    """The SEG's layout as text (see the module notes): what :func:`seg_layout_fingerprint` digests."""
    segments = _collapse(
        f"{_code(s, 'SegmentedPropertyCategoryCodeSequence')}/{_code(s, 'SegmentedPropertyTypeCodeSequence')}"
        for s in dataset.get("SegmentSequence") or []
    )
    return f"{dataset.get('SegmentationType', '')}|" + ",".join(segments) + "|" + _keywords(dataset)


def seg_layout_fingerprint(dataset: Any) -> str:
    """The fingerprint (16 hex digits) of a SEG's layout (a pydicom dataset; see the module notes)."""
    return _digest(seg_layout_text(dataset))
