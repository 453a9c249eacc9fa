"""The configuration schema: every option of ctpipe with its default, type, unit and allowed values.

Options live in sections (``ingest``, ``loader``, ``detector``, ``reconstruct``, ``outputs``, ``runner``,
``report``, ``privacy``, ``metrics``, ``pacs``): :data:`SCHEMA` maps each section to its options (:class:`Option`),
:data:`ALIASES` gives the short names accepted as overrides, and :func:`defaults` the built-in values.
``configs/default.yaml`` documents the same options with their units. Reading, validating and layering
values (file, environment, overrides) is :mod:`pipeline.config`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .devices import allowed_devices
from .dicom_out.kinds import OUTPUTS as DICOM_OUTPUTS
from .reconstruction.organs import ORGANS


@dataclass(frozen=True)
class Option:
    """One option: its default, type, unit and allowed values."""

    default: Any
    kind: str  # "int" | "float" | "bool" | "str" | "choice" | "path" | "choices" | "strs"
    unit: str = ""
    help: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def allowed(self) -> str:
        if self.kind in ("int", "float"):
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            hi = "inf" if self.hi is None else f"{self.hi:g}"
            text = f"a{'n integer' if self.kind == 'int' else ' number'} in [{lo}, {hi}]"
            if self.unit:
                text += f" ({self.unit})"
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "strs":
            text = "a list of strings"
        elif self.kind == "choices":
            text = "a list drawn from " + ", ".join(self.choices) + ", or none"
        elif self.kind == "path":
            text = "a file or folder path"
        else:
            text = "a string"
        if self.nullable:
            text += ", or null"
        return text


_MESH_FORMATS = ("stl", "ply", "obj", "glb")

#: The counts a received series' instances may carry, by DICOM keyword, that ``ctpipe listen`` can check it against
#: when its sender ends an association with an A-ABORT (``pacs.abort_count_check``) or a release
#: (``pacs.release_count_check``): Number of Series Related Instances (0020,1209), Images in Acquisition (0020,1002).
ABORT_COUNTS = ("NumberOfSeriesRelatedInstances", "ImagesInAcquisition")

SCHEMA: dict[str, dict[str, Option]] = {
    "ingest": {
        "min_slices": Option(10, "int", "slices", "fewest slices a series needs to be processed", lo=2),
        "allow_derived": Option(False, "bool", "", "also accept DERIVED/SECONDARY image types"),
        "spacing_tolerance": Option(
            0.02, "float", "fraction", "tolerated deviation of each slice step from the median step (0.02 = 2 %)", lo=0.0, hi=1.0
        ),
        "allow_gantry_tilt": Option(False, "bool", "", "resample tilted-gantry series instead of refusing them"),
    },
    "loader": {
        "backend": Option(
            "auto", "choice", "", "model-input loader (auto picks DALI when installed)", choices=("auto", "dali", "torch")
        ),
        "roi": Option(
            "none",
            "choice",
            "",
            "crop the model input to a region of interest (lungs: their box + roi_margin_mm)",
            choices=("none", "lungs"),
        ),
        "roi_margin_mm": Option(
            None,
            "float",
            "mm",
            "margin around the region of interest; null = the detector model's crop margin (lung_crop_margin_mm, 10 mm for "
            "the demo model), the crop of ctpipe detect; a value set here crops otherwise, and the findings may then "
            "differ from ctpipe detect's",
            lo=0.0,
            hi=200.0,
            nullable=True,
        ),
    },
    "detector": {
        "bundle": Option(None, "path", "", "MONAI bundle folder; null uses the embedded demo weights", nullable=True),
        "score_threshold": Option(
            None,
            "float",
            "probability",
            "report findings scoring at or above this; null = the model's operating point (chosen on validation data); the other candidates stay in the findings JSON",
            lo=0.0,
            hi=1.0,
            nullable=True,
        ),
        "all_candidates": Option(
            False, "bool", "", "report every candidate the detector keeps, whatever its score (overrides score_threshold)"
        ),
        "lung_restriction": Option(
            True,
            "bool",
            "",
            "restrict detection to the lungs' region (crop the model input to the lungs' box and drop findings outside the lungs)",
        ),
        "amp": Option(
            True,
            "bool",
            "",
            "mixed precision where the hardware runs it natively (float16 on a GPU, bfloat16 on CPUs with AVX512-BF16/AMX); false = float32",
        ),
        "postprocess": Option(
            True,
            "bool",
            "",
            "refine centres on the HU volume and re-score (the demo model's false-positive reduction; compact-blob rescoring for bundles); false = the network's boxes as MONAI returns them",
        ),
        "write_png": Option(
            True, "bool", "", "write a PNG per finding (axial slice, 10 mm MIP slab, 50 mm close-up in three planes)"
        ),
    },
    "reconstruct": {
        "enabled": Option(True, "bool", "", "run segmentation, meshing and renderings"),
        "organs": Option(list(ORGANS), "choices", "", "organs to segment and mesh", choices=ORGANS),
        "mesh_formats": Option(["stl"], "choices", "", "mesh file formats to write", choices=_MESH_FORMATS),
        "smoothing_iterations": Option(20, "int", "iterations", "mesh smoothing passes", lo=0, hi=500),
        "target_triangles": Option(
            None, "int", "triangles", "decimate each mesh to about this many triangles", lo=100, nullable=True
        ),
        "renderings": Option(True, "bool", "", "write MPR, MIP and 3D preview PNGs"),
        "device": Option(
            "cpu",
            "choice",
            "",
            "where segmentation runs: cpu (CPU workers) or model (the model worker's device)",
            choices=("cpu", "model"),
        ),
    },
    "outputs": {
        "dicom": Option(
            list(DICOM_OUTPUTS),
            "choices",
            "",
            "DICOM results of each case (<case>/dicom/): sr = TID 1500 structured report of the findings, measurements and quality flags; seg = segmentation of the organ and nodule masks; [] or none = no DICOM results; they copy Patient and Study from the source (to be filed with their study) and are the only run files with patient identifiers",
            choices=DICOM_OUTPUTS,
        ),
        "seg_omit_empty_frames": Option(
            True,
            "bool",
            "",
            "leave each segment's frames without any segmented voxel out of the SEG (as highdicom, dcmqi and OHIF write it: "
            "a viewer pages through the slices a segment touches, not hundreds of blank frames); false keeps one frame per "
            "slice per segment, for a viewer that maps frames to slices by their order",
        ),
    },
    "runner": {
        "workers": Option(
            2,
            "int",
            "processes",
            "CPU worker processes (0 runs every stage in this process, one case after another)",
            lo=0,
            hi=256,
        ),
        "device": Option("auto", "str", "", "model device: " + allowed_devices(several=True)),
        "queue_depth": Option(2, "int", "cases", "model inputs queued per model worker ahead of the one it runs", lo=1, hi=64),
        "max_in_flight": Option(
            0, "int", "cases", "cases admitted at once; 0 = 2 x (workers + model workers) + 2", lo=0, hi=4096
        ),
        "retries": Option(1, "int", "attempts", "extra attempts for a case whose worker process died", lo=0, hi=10),
        "stage_timeout_s": Option(
            3600.0,
            "float",
            "s",
            "longest time one stage of one case may run in a worker process before the worker is stopped and the case "
            "quarantined (a hung series never stops the batch); 0 = no limit",
            lo=0.0,
            hi=604800.0,
        ),
        "retry_failed": Option(False, "bool", "", "re-attempt cases quarantined by an earlier run of the same folder"),
        "stable_age_s": Option(
            0.0,
            "float",
            "s",
            "a series whose newest file changed less than this long ago is still being written (an archive or PACS "
            "exporting into the source folder): left for the next run, listed as a skipped series; 0 = take every series",
            lo=0.0,
            hi=86400.0,
        ),
        "keep_cache": Option(False, "bool", "", "keep each case's cached HU array after the case completes"),
        "torch_threads": Option(0, "int", "threads", "torch threads per worker; 0 = cores / processes", lo=0, hi=256),
        "start_method": Option("forkserver", "choice", "", "how worker processes start", choices=("forkserver", "spawn", "fork")),
        "worklist_root": Option(
            None, "path", "", "base folder for relative paths in a worklist CSV (default: the CSV's folder)", nullable=True
        ),
        "engine": Option(
            "local",
            "choice",
            "",
            "where stages run: local (worker processes on this machine) or ray (actors across a Ray cluster)",
            choices=("local", "ray"),
        ),
        "ray_address": Option(
            None,
            "str",
            "",
            "Ray cluster of runner.engine = ray: auto (the one this machine joined with ray start), HOST:PORT of its "
            "head, or local / null (a private Ray instance on this machine for the run)",
            nullable=True,
        ),
        "ray_max_cpus": Option(
            0,
            "int",
            "CPUs",
            "runner.engine = ray: CPU actors of this run at most (one CPU each), leaving the rest of the cluster to other "
            "runs; 0 = every CPU",
            lo=0,
            hi=1_000_000,
        ),
        "ray_max_gpus": Option(
            0,
            "int",
            "GPUs",
            "runner.engine = ray: model actors on GPUs of this run at most (one GPU each); 0 = every GPU",
            lo=0,
            hi=100_000,
        ),
        "ray_reconnect_s": Option(
            600.0,
            "float",
            "s",
            "runner.engine = ray: how long a run waits for a head that stops answering mid-run (a network outage, the "
            "head restarting), trying again with growing pauses, before it stops for a rerun to resume",
            lo=1.0,
            hi=86400.0,
        ),
        "ray_timeout_s": Option(
            60.0,
            "float",
            "s",
            "runner.engine = ray: longest wait to connect to the cluster and to place the actors a stage needs",
            lo=1.0,
            hi=86400.0,
        ),
    },
    "report": {
        "enabled": Option(True, "bool", "", "write the report at the end of every run"),
        "bin_minutes": Option(
            0,
            "int",
            "minutes",
            "bin width of the throughput-over-time plot; 0: chosen from the run's span (seconds or minutes for a "
            "short run, up to an hour for a nightly run, days over several days)",
            lo=0,
            hi=1440,
        ),
        "hours_per_day": Option(
            24.0, "float", "hours", "operating hours per day used for the cases/day projection", lo=0.1, hi=24.0
        ),
    },
    "privacy": {
        "keep_identifiers": Option(
            False,
            "bool",
            "",
            "keep patient identifiers: PatientID, PatientName, PatientBirthDate and AccessionNumber, and the series "
            "description as it is, in the case cache and volume.json (the others, such as InstitutionName and the "
            "physicians' names, are never read), and folder and file names that hold one written as they are in "
            "run.log, the console, the run store and the report; by default these read <patient:xxxxxx> (<patient> in "
            "a description) and identifiers are left out of everything a run writes but its DICOM results",
        ),
    },
    "metrics": {
        "port": Option(
            None, "int", "TCP port", "serve Prometheus metrics over HTTP during a run; null = off", lo=1, hi=65535, nullable=True
        ),
        "bind": Option("127.0.0.1", "str", "", "address the metrics server listens on"),
        "textfile": Option(True, "bool", "", "write RUN_DIR/metrics.prom for node_exporter's textfile collector"),
        "textfile_dir": Option(
            None,
            "path",
            "",
            "also write metrics.textfile_name into this folder (node_exporter --collector.textfile.directory)",
            nullable=True,
        ),
        "textfile_name": Option(
            "ctpipe.prom",
            "str",
            "",
            "name of the file written into metrics.textfile_dir, ending in .prom; jobs that may run at once on one node "
            "(a nightly run and a listener) each need their own, or the last to end overwrites the other's values",
        ),
        "nvml_interval_s": Option(2.0, "float", "s", "GPU utilisation/memory sampling interval", lo=0.1, hi=3600.0),
        "linger_s": Option(
            0.0,
            "float",
            "s",
            "keep serving the metrics this long after the run ends, so that a scrape takes the final values "
            "(at least Prometheus' scrape interval; 0 = stop at once, the textfile holds them); not counted in the run's time",
            lo=0.0,
            hi=600.0,
        ),
    },
    "pacs": {
        "ae_title": Option(
            "CTPIPE",
            "str",
            "",
            "ctpipe's DICOM AE title: calling AE of queries and retrievals, called AE of ctpipe listen and of C-MOVE retrievals",
        ),
        "bind": Option("127.0.0.1", "str", "", "address ctpipe listen and the C-MOVE storage SCP listen on"),
        "port": Option(11112, "int", "TCP port", "port of ctpipe listen", lo=1, hi=65535),
        "move_port": Option(
            11113,
            "int",
            "TCP port",
            "port of the storage SCP that receives C-MOVE retrievals (the archive must know ae_title there)",
            lo=1,
            hi=65535,
        ),
        "allowed_aets": Option([], "strs", "", "calling AE titles ctpipe listen accepts instances from; empty = none"),
        "check_called_aet": Option(
            True,
            "bool",
            "",
            "ctpipe listen and the C-MOVE storage SCP reject associations addressed to another AE title than ae_title",
        ),
        "quiet_period_s": Option(
            30.0, "float", "s", "a received series is complete after this long without a new instance", lo=0.1, hi=86400.0
        ),
        "series_limit_s": Option(
            3600.0,
            "float",
            "s",
            "a received series still incomplete this long after its first instance is reported and processed as it is",
            lo=1.0,
            hi=604800.0,
        ),
        "abort_count_check": Option(
            list(ABORT_COUNTS),
            "choices",
            "",
            "counts of its instances that ctpipe listen checks a series against when its sender ends with an A-ABORT "
            "between instances: fewer instances than one gives holds the series as cut off (quarantined after "
            "series_limit_s). Leave a count out where the sender ends every sending with an A-ABORT and its instances "
            "count images not sent here (ImagesInAcquisition over series of the acquisition routed elsewhere): every "
            "series would be held, and sent again, held again; none = no count checked (the A-ABORT taken as the "
            "end of the sending; a gap or an A-ABORT in the middle of an instance still holds the series)",
            choices=ABORT_COUNTS,
        ),
        "release_count_check": Option(
            list(ABORT_COUNTS),
            "choices",
            "",
            "counts of its instances that ctpipe listen checks a series against when its sender ends with a release "
            "(A-RELEASE), as a store job cancelled or paused part-way does: fewer instances than one gives holds the "
            "series as cut off until the rest arrives (quarantined after series_limit_s). Leave a count out only where "
            "the instances count images never sent here (ImagesInAcquisition over series of the acquisition routed "
            "elsewhere): every such series would be held; none = no count checked (a release taken as the end of "
            "the series, as before this check)",
            choices=ABORT_COUNTS,
        ),
        "retrieve": Option(
            "move", "choice", "", "DIMSE retrieval: C-MOVE to ctpipe's storage SCP, or C-GET", choices=("move", "get")
        ),
        "timeout_s": Option(
            30.0, "float", "s", "network timeout of a request, an association and each DIMSE message", lo=0.1, hi=3600.0
        ),
        "retries": Option(3, "int", "attempts", "extra attempts of a request that failed for a transient reason", lo=0, hi=20),
        "backoff_s": Option(1.0, "float", "s", "wait before the first retry; doubled for each further one", lo=0.0, hi=600.0),
        "tls_verify": Option(True, "bool", "", "verify HTTPS certificates of DICOMweb archives"),
        "ca_bundle": Option(None, "path", "", "CA certificates for HTTPS; null = the system's", nullable=True),
        "netrc": Option(None, "path", "", "netrc-style credentials file; null = $NETRC or ~/.netrc", nullable=True),
        "send_to": Option(
            None, "str", "", "destination of the DICOM results (SR, SEG) of completed cases; null = none", nullable=True
        ),
        "incomplete_keep_s": Option(
            259200.0,
            "float",
            "s",
            "a series ctpipe listen quarantined incomplete keeps its received files this long after its last instance "
            "(whatever keep_received says), so that its missing instances, sent later, complete it; 0 = no wait",
            lo=0.0,
            hi=31_536_000.0,
        ),
        "keep_received": Option(
            "none",
            "choice",
            "",
            "received DICOM kept after its case was processed: none, failed (quarantined cases only) or all",
            choices=("none", "failed", "all"),
        ),
        "send_retries": Option(
            5,
            "int",
            "attempts",
            "extra attempts to send a result file after a transient failure before it is recorded as failed (a refusal fails at once)",
            lo=0,
            hi=100,
        ),
        "verify_sent": Option(
            True,
            "bool",
            "",
            "after sending, ask the destination (C-FIND at IMAGE level or QIDO-RS, one query per case) whether it holds "
            "each result; one it does not hold is not recorded sent (retried, then failed)",
        ),
        "send_drain_s": Option(
            60.0,
            "float",
            "s",
            "at the end of ctpipe run, wait at most this long for results still being sent",
            lo=0.0,
            hi=86400.0,
        ),
    },
}

# short names accepted as keyword overrides (run_batch(workers=4)) and CLI flags
ALIASES = {
    "workers": "runner.workers",
    "device": "runner.device",
    "bundle": "detector.bundle",
    "metrics_port": "metrics.port",
    "retry_failed": "runner.retry_failed",
    "keep_identifiers": "privacy.keep_identifiers",
    "engine": "runner.engine",
    "ray_address": "runner.ray_address",
}


def defaults() -> dict[str, dict[str, Any]]:
    """The built-in value of every option, by section (fresh copies: a caller may change them)."""
    return {sec: {k: copy.deepcopy(o.default) for k, o in opts.items()} for sec, opts in SCHEMA.items()}
