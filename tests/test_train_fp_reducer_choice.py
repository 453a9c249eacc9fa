"""The validation choice of ``scripts/train_fp_reducer.py``: ties lean on both stages evenly."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests._support.scripts import import_script


@pytest.fixture(scope="module")
def trainer() -> ModuleType:
    return import_script("fpr_validation")


def test_a_clear_winner_is_chosen_whatever_its_weight(trainer: ModuleType) -> None:
    val = {"4/0.0/2.0/box": 0.80, "4/0.25/2.0/box": 0.77, "4/0.5/2.0/box": 0.76}
    assert trainer.choose_setting(val, tolerance=0.005) == "4/0.0/2.0/box"


def test_within_the_tolerance_the_even_weighting_wins(trainer: ModuleType) -> None:
    val = {"4/0.0/2.0/box": 0.768, "4/0.25/2.0/box": 0.770, "4/0.5/2.0/box": 0.767, "1/0.5/2.0/box": 0.747}
    assert trainer.choose_setting(val, tolerance=1 / 182) == "4/0.5/2.0/box"
    assert trainer.choose_setting(val, tolerance=0.001) == "4/0.25/2.0/box"


def test_among_even_weightings_the_best_cpm_then_box_merging(trainer: ModuleType) -> None:
    val = {"4/0.5/1.0": 0.765, "4/0.5/2.0": 0.767, "4/0.5/2.0/box": 0.767, "4/0.25/2.0": 0.770}
    assert trainer.choose_setting(val, tolerance=0.005) == "4/0.5/2.0/box"


def test_blob_support_wins_a_tie_but_not_a_clear_loss(trainer: ModuleType) -> None:
    tied = {"4/0.5/2.0/box": 0.770, "4/0.5/2.0/box/support": 0.767}
    assert trainer.choose_setting(tied, tolerance=0.005) == "4/0.5/2.0/box/support"
    lost = {"4/0.5/2.0/box": 0.770, "4/0.5/2.0/box/support": 0.750}
    assert trainer.choose_setting(lost, tolerance=0.005) == "4/0.5/2.0/box"


def test_settings_parse_into_the_config_fields(trainer: ModuleType) -> None:
    assert trainer.parse_setting("4/0.5/2.0/box/support") == {
        "flip_views": 4,
        "detector_weight": 0.5,
        "duplicate_radius_factor": 2.0,
        "box_merge": True,
        "blob_support": True,
    }
    assert trainer.parse_setting("1/0.25/1.0")["box_merge"] is False
    with pytest.raises(ValueError, match="unknown parts"):
        trainer.parse_setting("1/0.25/1.0/boxes")


def test_no_results_is_an_error_that_names_the_fix(trainer: ModuleType) -> None:
    with pytest.raises(ValueError, match="--n-val"):
        trainer.choose_setting({}, tolerance=0.005)
