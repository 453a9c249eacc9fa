"""ctpipe's storage SCP for C-MOVE retrievals (:class:`MoveReceiver`), used by
:class:`~pipeline.pacs.dimse.DimseArchive` while a retrieval runs: ``pacs.ae_title`` at ``pacs.bind``:``pacs.move_port``,
taking CT instances from the archive's AE title only, each written into the folder routed to its series. Records are
logged as ``pipeline.pacs.dimse``'s, as the retrieval's own.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import PacsReceiverError
from .address import listen_error
from .ports import port_holder
from .scp import STATUS_OUT_OF_RESOURCES, build_ae, ct_storage_contexts, store_event

log = logging.getLogger("pipeline.pacs.dimse")


class MoveReceiver:
    """ctpipe's storage SCP for C-MOVE retrievals: ``pacs.ae_title`` at ``pacs.bind``:``pacs.move_port``.

    Accepts CT instances from ``archive_aet`` only and writes each into the folder routed to its series
    (:meth:`route`); instances of other series are refused (status 0xC000).
    """

    def __init__(self, cfg: Any, *, archive_aet: str):
        from pynetdicom import evt

        self.cfg = cfg
        self._routes: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a write into a routed folder ends
        self._writing: Counter[str] = Counter()  # writes under way, by series
        #: (calling, called) AE titles of the associations turned away, in order (for the error of a C-MOVE that got
        #: nothing)
        self.turned_away: list[tuple[str, str]] = []
        self.ae = build_ae(cfg)
        for abstract, syntaxes in ct_storage_contexts(accept_all=True):
            self.ae.add_supported_context(abstract, syntaxes)
        self.ae.require_calling_aet = [archive_aet]
        self.ae.require_called_aet = bool(cfg.pacs.check_called_aet)
        try:
            self.server = self.ae.start_server(
                (cfg.pacs.bind, cfg.pacs.move_port),
                block=False,
                ae_title=cfg.pacs.ae_title,
                evt_handlers=[(evt.EVT_C_STORE, self._on_store), (evt.EVT_REJECTED, self._on_rejected)],
            )
        except OSError as exc:
            self.ae.shutdown()
            raise _receiver_error(exc, cfg) from exc

    @contextmanager
    def route(self, series_uid: str, folder: Path) -> Iterator[None]:
        """Write instances of ``series_uid`` into ``folder`` while in the block; leaving it refuses the later ones and
        waits (up to ``pacs.timeout_s``) for the writes already under way, so that the caller may then remove or
        publish the folder without a file landing in it afterwards."""
        with self._lock:
            self._routes[series_uid] = folder
        try:
            yield
        finally:
            with self._idle:
                self._routes.pop(series_uid, None)
                if not self._idle.wait_for(lambda: not self._writing[series_uid], timeout=float(self.cfg.pacs.timeout_s)):
                    log.warning("C-MOVE receiver: a write into %s still under way after pacs.timeout_s", folder)

    def _on_store(self, event: Any) -> Any:
        taken: list[str] = []

        def folder_for(ds: Any) -> Path | None:
            uid = str(ds.get("SeriesInstanceUID", ""))
            with self._lock:
                folder = self._routes.get(uid)
                if folder is not None:  # counted until written: leaving the route waits for it
                    self._writing[uid] += 1
                    taken.append(uid)
            return folder

        try:
            return store_event(event, folder_for)
        except OSError as exc:
            log.error("C-MOVE receiver: cannot write an instance (%s)", exc)
            return STATUS_OUT_OF_RESOURCES
        finally:
            if taken:
                with self._idle:
                    self._writing[taken[0]] -= 1
                    self._idle.notify_all()

    def _on_rejected(self, event: Any) -> None:
        calling = str(event.assoc.requestor.ae_title).strip()
        called = str(getattr(event.assoc.requestor.primitive, "called_ae_title", "") or "").strip()
        log.warning(
            "C-MOVE receiver %s turned away an association from calling AE title %r at %s, addressed to %r",
            self.cfg.pacs.ae_title,
            calling,
            getattr(event.assoc.requestor, "address", "?"),
            called,
            extra={"event": "move_receiver_rejected"},
        )
        with self._lock:
            self.turned_away.append((calling, called))

    def close(self) -> None:
        self.server.shutdown()
        self.ae.shutdown()


def _receiver_error(exc: OSError, cfg: Any) -> PacsReceiverError:
    """The error of a C-MOVE receiver that cannot listen on ``pacs.bind``:``pacs.move_port``: for a port in use,
    with the process holding it when this machine tells (:func:`~pipeline.pacs.ports.port_holder`). Not worth
    another attempt: every retrieval of the source would meet the same port."""
    import errno

    bind, port = cfg.pacs.bind, int(cfg.pacs.move_port)
    if exc.errno == errno.EADDRINUSE:
        holder = port_holder(port)
        by = f" by {holder}" if holder else " by another process"
        return PacsReceiverError(
            f"ctpipe's C-MOVE receiver cannot listen on {bind}:{port}: the port is already in use{by}",
            where="pacs.move_port",
            fix=f"stop what holds port {port} (another ctpipe run or listener, a storescp), or set pacs.move_port to "
            f"a free port and list ctpipe's AE title {cfg.pacs.ae_title!r} at that port in the archive; or retrieve by "
            "C-GET (retrieve=get), which needs no receiver port",
        )
    err = listen_error(
        exc, bind, port, port_key="pacs.move_port", port_fix="choose another pacs.move_port, or use C-GET (retrieve=get)"
    )
    return PacsReceiverError(f"ctpipe's C-MOVE receiver {err.problem}", where=err.where, fix=err.fix)
