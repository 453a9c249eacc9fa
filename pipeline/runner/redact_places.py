"""Where a skipped file's or folder's token stands in a text (:class:`pipeline.runner.redact.PathRedactor`): after a
path that names the folder it lies in, by that folder's resolved path as far as the path shown allows.

A place is recorded by its location (the real path of the folder holding it, joined with its name: a symbolic link
is its own place, not its target's) and the forms a path may show of that folder (as the scan wrote it, absolute, with
links resolved). In a text, the path before the name is read back from each point where a path may begin (the start
of the line, or after a space, a quote, a comma, ``=``, a bracket): the name stands for the place when one such path
resolves to that folder (relative ones from the current folder, links followed), is one of its forms, or, relative,
ends as one of its forms does (``inbox/DOE/notes.txt``, relative to an unknown folder: the doubt falls on the side of
the token); after a token (a text redacted once already) what follows the last token must end a form. It stands for
another folder only when no such path does and the path shown is an absolute one of an existing folder, or one whose
last folder has another name; an absolute path of no existing folder with the same last folder is taken for it, and
so is a path that does not begin plainly (no absolute path nor a relative one beginning with a name's character).
Where one name stands for several places, each with a token of its own, :class:`PlaceIndex` tells which one a path
shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePath

_TOKEN = re.compile(r"<\w+:[0-9a-f]{6}>")
_SEP = re.compile(r"[/\\]")
#: where a path may begin in a text: after one of these (or at the start of a line)
_BOUNDARY = frozenset(" \t'\"`,;=([{|>")
#: how a relative path shown plainly begins (not ``<td>inbox``: a text whose path begins where no boundary says)
_PLAIN = re.compile(r"[\w.~\-]")
#: the nearest points where a path may begin that are read back (a path with more spaces is taken for the place)
MAX_STARTS = 32
#: how far back in a line a path is read
MAX_CHARS = 4096


def location(path: str | os.PathLike[str]) -> str:
    """The place of ``path``: the real path of its folder joined with its name (a link stays a link)."""
    p = PurePath(os.path.abspath(path))
    return os.path.join(os.path.realpath(p.parent), p.name) if p.name else os.path.realpath(p)


def parent_forms(path: str | os.PathLike[str]) -> set[str]:
    """The forms a path shows of the folder holding ``path``: as given (normalised), absolute, links resolved."""
    parent = PurePath(path).parent
    return {os.path.normpath(parent), os.path.abspath(parent), os.path.realpath(parent)}


def _parts(path: str) -> list[str]:
    return [p for p in _SEP.split(path) if p and p != "."]


def _is_absolute(path: str) -> bool:
    return path[:1] in ("/", "\\") or bool(re.match(r"[A-Za-z]:[/\\]", path))


def _ends_a_form(parts: list[str], forms: set[str]) -> bool:
    """Whether the relative path of ``parts`` (``..`` and what comes before it dropped) ends one of ``forms``."""
    if ".." in parts:
        parts = parts[len(parts) - parts[::-1].index("..") :]
    n = len(parts)
    return any(n == 0 or _parts(f)[-n:] == parts for f in forms)


def _starts(head: str) -> list[int]:
    """The points of ``head`` (the text before a name, its separator included) where the path before it may begin,
    nearest first, :data:`MAX_STARTS` at most."""
    begin = max(head.rfind("\n") + 1, head.rfind("\r") + 1, len(head) - MAX_CHARS, 0)
    starts = [i for i in range(len(head) - 1, begin, -1) if head[i - 1] in _BOUNDARY]
    return [*starts, begin][:MAX_STARTS]


def _candidate(head: str, start: int) -> str:
    """The folder the path beginning at ``start`` of ``head`` shows before the name: its trailing separator dropped,
    but for the root."""
    p = head[start:]
    return p[:-1] if len(p) > 1 and p[-1] in "/\\" else p


def stands_for(head: str, forms: set[str]) -> bool:
    """Whether the name after ``head`` (the text before it, ending in a separator, or in nothing where a path begins at
    the name) stands for a place whose folder a path shows by one of ``forms`` (see the module)."""
    real = {f for f in forms if _is_absolute(f)}  # the absolute forms: one of them has its links resolved
    candidates = [_candidate(head, s) for s in _starts(head)] if head.endswith(("/", "\\")) else [""]
    resolvable: list[str] = []
    for p in candidates:  # by the text first: no file system call
        if (tokens := list(_TOKEN.finditer(p))) and _ends_a_form(_parts(p[tokens[-1].end() :]), forms):
            return True
        if tokens or "\0" in p:
            continue
        if _ends_a_form(_parts(p), forms) if not _is_absolute(p) else os.path.normpath(p) in forms:
            return True
        resolvable.append(p)
    if any(os.path.realpath(p or ".") in real for p in resolvable):  # relative ones from the current folder
        return True
    absolute = [p for p in resolvable if _is_absolute(p)]
    if any(os.path.isdir(p) for p in absolute):
        return False
    names = {os.path.basename(f) for f in forms}
    if any(os.path.basename(p) in names for p in absolute):
        return True  # a path of no existing folder: by its last folder's name, in doubt
    if absolute or any(_PLAIN.match(p) for p in resolvable):
        return False
    return any(os.path.basename(p) in names for p in resolvable)  # no path shown plainly: by the name, in doubt


#: the rank of a place a path shows by its folder itself (absolute, resolved from the current folder, or after the
#: token of a folder above it), above one it ends as a relative path does (ranked by how many folders it shows)
_EXACT = 1 << 16


class PlaceIndex:
    """The places of one name (location: forms, in the order recorded) looked up by the path before the name in a
    text (:meth:`place_of`), for a name that stands for several (``a/PATIENT_X`` and ``b/PATIENT_X``), each with a
    token of its own. ``folder_at``: the location of each folder token (a text redacted once shows a parent so)."""

    def __init__(self, places: Mapping[str, Iterable[str]], folder_at: Mapping[str, str]) -> None:
        self.first = next(iter(places))
        self._folder_at = folder_at
        self._order = {loc: n for n, loc in enumerate(places)}
        self._by_form: dict[str, list[str]] = {}
        self._by_tail: dict[tuple[str, ...], list[str]] = {}
        for loc, forms in places.items():
            for form in forms:
                self._by_form.setdefault(os.path.normpath(form), []).append(loc)
                parts = _parts(form)
                for n in range(1, len(parts) + 1):
                    self._by_tail.setdefault(tuple(parts[-n:]), []).append(loc)

    def place_of(self, head: str) -> str:
        """The place the name after ``head`` (as :func:`stands_for` reads it) stands for: the one whose folder the
        path before it shows itself, else the one whose forms end with the longest relative path shown, else (the
        path shows none of them more than the others: a name alone) the first recorded."""
        ranks: dict[str, int] = {}

        def rank(locs: Iterable[str], value: int) -> None:
            for loc in locs:
                ranks[loc] = max(ranks.get(loc, -1), value)

        candidates = [_candidate(head, s) for s in _starts(head)] if head.endswith(("/", "\\")) else [""]
        for p in candidates:
            if tokens := list(_TOKEN.finditer(p)):
                last = tokens[-1]
                if (at := self._folder_at.get(last.group())) is not None:
                    shown = os.path.normpath(os.path.join(at, *_parts(p[last.end() :])))
                    rank(self._by_form.get(shown, ()), _EXACT)
                continue
            if "\0" in p:
                continue
            if _is_absolute(p):
                rank(self._by_form.get(os.path.normpath(p), ()), _EXACT)
            else:
                parts = _parts(p)
                if ".." in parts:
                    parts = parts[len(parts) - parts[::-1].index("..") :]
                if parts:
                    rank(self._by_tail.get(tuple(parts), ()), len(parts))
            rank(self._by_form.get(os.path.realpath(p or "."), ()), _EXACT)
        if not ranks:
            return self.first
        return max(ranks, key=lambda loc: (ranks[loc], -self._order[loc]))
