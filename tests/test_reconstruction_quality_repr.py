"""A QualityReport echoes as one short line (flags counted by severity, with their codes); print() gives it all."""

from __future__ import annotations

from pipeline.reconstruction.quality import EMPHYSEMA_FIGURES, FLAGS, QualityReport

CODES = ("lungs_base_cut", "thick_slices", "lossy_compressed", "contrast_venous")


def _report() -> QualityReport:
    flags = [{"code": c, "severity": FLAGS[c][0], "message": f"{FLAGS[c][1]} (measured 12.3)"} for c in CODES]
    figures = {"lung_volume_ml": 4321.123, "lung_base_cut_area_mm2": 850.0, "contrast_p90_hu": None}
    return QualityReport.from_json(
        {
            "lung_coverage": "partial",
            "contrast_phase": "venous",
            "flags": flags,
            "unreliable": list(EMPHYSEMA_FIGURES),
            "figures": figures,
        }
    )


def test_repr_is_one_short_line_of_counts_and_codes():
    text = repr(_report())
    assert "\n" not in text and len(text) < 220, text
    assert text == (
        "QualityReport(lung_coverage='partial', contrast_phase='venous', "
        "3 warnings ['lungs_base_cut', 'thick_slices', 'lossy_compressed'], 1 info ['contrast_venous'], "
        "3 unreliable figures; print() for the messages)"
    )
    empty = QualityReport(lung_coverage="complete", contrast_phase="non_contrast")
    assert repr(empty) == (
        "QualityReport(lung_coverage='complete', contrast_phase='non_contrast', no flags; print() for the messages)"
    )


def test_str_keeps_every_message_unreliable_figure_and_figure():
    report = _report()
    text = str(report)
    for flag in report.flags:
        assert f"{flag.severity:<7}" in text and flag.code in text and flag.message in text
    assert all(name in text for name in EMPHYSEMA_FIGURES)
    assert "lung_volume_ml 4321.12" in text and "contrast_p90_hu none" in text
    assert text.splitlines()[0] == "QualityReport: lung coverage partial, contrast phase venous"
