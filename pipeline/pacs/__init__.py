"""PACS in and out: CT series from DICOMweb and DIMSE archives, a C-STORE listener, results sent back.

* **Sources for ``ctpipe run``** (:mod:`.address` has the syntax): ``dicomweb+http(s)://HOST:PORT/PATH?QUERY``
  (QIDO-RS search, WADO-RS retrieval) and ``dimse://AET@HOST:PORT?QUERY`` (C-FIND, then C-MOVE to
  ctpipe's storage SCP or C-GET). :func:`fetch_sources` retrieves the selected series into
  ``RUN_DIR/pacs/spool/<SeriesInstanceUID>/`` (each folder appears complete or not at all) and
  records them in the ledger (:mod:`.ledger`), so a rerun neither fetches nor processes a series twice.
* **``ctpipe listen``** (:class:`Listener`): a C-STORE SCP for CT that writes and syncs each
  instance before answering, groups instances into series, and hands complete series to the
  crash-safe runner continuously; after a crash, nothing received is lost or processed twice.
* **Results back** (:class:`ResultSender`): the SR and SEG files of completed cases go to
  ``pacs.send_to`` by STOW-RS or C-STORE from a background thread, retried with backoff, recorded.

Credentials come from the environment or a netrc file, never from addresses or configs
(:mod:`.auth`); HTTPS certificates are verified unless switched off; the listener binds 127.0.0.1
and accepts only configured calling AE titles. Settings: section ``pacs`` of ``configs/default.yaml``.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "PacsSource": "pipeline.pacs.address",
    "parse_source": "pipeline.pacs.address",
    "parse_destination": "pipeline.pacs.address",
    "is_pacs_address": "pipeline.pacs.address",
    "FetchResult": "pipeline.pacs.fetch",
    "fetch_sources": "pipeline.pacs.fetch",
    "open_archive": "pipeline.pacs.connect",
    "RemoteSeries": "pipeline.pacs.archive",
    "Listener": "pipeline.pacs.listener",
    "SeriesOutcome": "pipeline.pacs.handover",
    "ResultSender": "pipeline.pacs.sender",
    "result_files": "pipeline.pacs.sender",
    "Ledger": "pipeline.pacs.ledger",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
