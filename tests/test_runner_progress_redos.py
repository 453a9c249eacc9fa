"""The live progress of a run shows cases done again (their published folder removed) apart from new ones."""

from __future__ import annotations

from pipeline.runner.progress import Progress, TqdmBar
from pipeline.runner.stage import CaseSpec


def _case(key: str) -> CaseSpec:
    return CaseSpec(case_id=key, case_key=key, series_uid=None, fingerprint="f", source=f"/data/{key}")


def _run(progress: Progress) -> None:
    progress.expect_redos({"c4"})
    for key in ("c1", "c2", "c3", "c4"):
        progress.on_case_done(_case(key), 10.0, 0)


def test_describe_counts_a_case_done_again_apart() -> None:
    p = Progress(total=4)
    _run(p)
    assert p.done == 3 and p.redone == 1, (p.done, p.redone)
    assert p.describe().startswith("3 done, 1 done again, 0 failed of 4 |"), p.describe()
    assert p.finished == 4  # the work was done: the bar and the rate count it


def test_describe_without_redos_is_unchanged() -> None:
    p = Progress(total=2)
    p.on_case_done(_case("c1"), 1.0, 0)
    assert p.describe().startswith("1 done, 0 failed of 2 |"), p.describe()


def test_tqdm_bar_names_the_redos() -> None:
    bar = TqdmBar(4)
    try:
        p = Progress(total=4, callback=bar)
        _run(p)
        assert bar.bar.n == 4
        assert "done again=1" in bar.bar.postfix, bar.bar.postfix
    finally:
        bar.close()
