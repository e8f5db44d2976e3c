"""Identifiability and minimal model synthesis: the seed's 2R table, the PUMA 560 counts, and the count
formulas N = 6 + 4R + 2P, N_p = 3 + 4R + 2P - 2s, N_r = N - 6, N_pr = N_p - 6 on every arm we load."""
from __future__ import annotations

import numpy as np
import pytest

from ident.calibration.model import from_model
from ident.calibration.synthesis import (classify, describe, expected_count, random_configurations,
                                         scaled_jacobian, strategy_order, synthesize)
from firmware_bridge.runtime.errors import InputError
from test_calibration_arms import arm

# seed 002, 2R results (14 parameters each); TJR is printed as identical to TJL
SEED_2R_TABLE = {
    "JL": "[Tx Ty Tz Rx Ry]_0 Rz(q1) [Tx Rx Ry]_1 Rz(q2) [Tx Ty Rx Ry]_2",
    "BJL": "[Tx Ty Tz Rx Ry Rz]_0 Rz(q1)^o [Tx Rx Ry]_1 Rz(q2) [Tx Ty Rx Ry]_2",
    "TJL": "[Tx Ty Rx Ry]_0 Rz(q1) [Tx Rx Ry]_1 Rz(q2)^o [Tx Ty Tz Rx Ry Rz]_2",
    "JR": "[Tx Ty Rx Ry]_0 Rz(q1) [Tx Rx Ry]_1 Rz(q2) [Tx Tz Rx Ry Rz]_2",
    "BJR": "[Tx Ty Tz Rx Ry Rz]_0 Rz(q1)^o [Tx Rx Ry]_1 Rz(q2) [Tx Rx Ry Rz]_2",
    "TJR": "[Tx Ty Rx Ry]_0 Rz(q1) [Tx Rx Ry]_1 Rz(q2)^o [Tx Ty Tz Rx Ry Rz]_2",
}


@pytest.mark.parametrize("strategy", sorted(SEED_2R_TABLE))
def test_planar_2r_gives_the_seeds_six_model_rows(strategy):
    cm = from_model(arm("planar2r"))
    assert cm.m == 20
    irr = synthesize(cm, "pose", strategy=strategy)
    assert irr.count == 14
    assert describe(irr) == SEED_2R_TABLE[strategy]


def test_planar_2r_counts_full_pose_and_position():
    cm = from_model(arm("planar2r"))
    assert synthesize(cm, "pose").identifiability.rank == 14
    assert synthesize(cm, "position").count == 11 == expected_count(cm, "position")


@pytest.mark.parametrize("tool, case, expected", [
    ((0, 0, 0), ("pose", False), 30),
    ((0, 0, 0), ("position", False), 25),        # symmetric tool: on axis 6, s = 1
    ((0.1, 0.05, 0.05), ("position", False), 27),  # offset tool, s = 0
    ((0, 0, 0), ("position", True), 19),
    ((0.1, 0.05, 0.05), ("position", True), 21),
    ((0, 0, 0), ("pose", True), 24),
])
def test_puma560_counts_are_the_seeds(tool, case, expected):
    cm = from_model(arm("puma560"), tool)
    measure, relative = case
    irr = synthesize(cm, measure, relative=relative)
    assert irr.count == expected == expected_count(cm, measure, relative)
    assert cm.m == 48


@pytest.mark.parametrize("name, tool", [("generic6", (0, 0, 0)), ("generic6", (0.12, 0, 0)),
                                        ("ur5", (0, 0.1, 0)), ("ur5", (0.04, 0.12, 0.03)),
                                        ("stanford_RRPRRR", (0.05, 0.02, 0.1)), ("scara_RRPR", (0.1, 0, 0)),
                                        ("cylindrical_RPPR", (0.1, 0.1, 0)), ("skew_RRR", (0.1, 0.05, 0.2))])
@pytest.mark.parametrize("measure", ["pose", "position"])
@pytest.mark.parametrize("relative", [False, True])
def test_counts_match_the_formulas_on_every_arm(name, tool, measure, relative):
    cm = from_model(arm(name), tool)
    irr = synthesize(cm, measure, relative=relative)
    assert irr.count == expected_count(cm, measure, relative)
    # the selection is complete: it spans everything the redundant model can do
    assert int(irr.identified.sum()) == irr.identifiability.rank


def test_tool_at_the_wrist_centre_loses_the_three_wrist_offsets():
    import dataclasses
    model = dataclasses.replace(arm("puma560"), flange_p=np.zeros(3))
    cm = from_model(model)
    assert expected_count(cm, "position") == 3 + 24 - 6 == synthesize(cm, "position").count


def test_position_only_makes_the_tool_rotations_non_identifiable_and_finds_the_parallel_axis_group():
    cm = from_model(arm("puma560"), (0.1, 0.05, 0.05))
    names = cm.names()
    idf = synthesize(cm, "position").identifiability
    non = {names[k] for k, s in enumerate(idf.status) if s == "non-identifiable"}
    assert non == {"Rx6", "Ry6", "Rz6"}
    # axes 2 and 3 are parallel: the three translations along them act only through their sum
    # (the seed's PUMA DH d2, d3 seen only as d2 - d3)
    groups = [{names[k] for k in g} for g in idf.groups]
    assert {"Ty1", "Tz2", "Tz3"} in groups
    assert idf.rank == 27


def test_classification_of_a_known_matrix():
    J = np.array([[1.0, 0, 1, 0, 0], [0, 1, 0, 0, 2], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0], [0, 2, 0, 0, 4]])
    J = np.vstack([J, [[0, 0, 0, 0, 0]]])
    idf = classify(J)
    assert idf.rank == 2
    assert idf.status[3] == "non-identifiable"
    assert {frozenset(g) for g in idf.groups} == {frozenset({0, 2}), frozenset({1, 4})}


def test_nonzero_nominal_terms_are_kept_fixed_and_zero_ones_deleted():
    cm = from_model(arm("puma560"))
    for measure in ("pose", "position"):
        irr = synthesize(cm, measure)
        assert not np.any(irr.deleted & (cm.nominal != 0.0))
        assert not np.any(irr.deleted & cm.is_joint)
        assert not np.any(irr.fixed & irr.identified)
        assert np.all(irr.fixed == (~irr.identified & (cm.is_joint | (cm.nominal != 0.0))))


def test_selected_columns_have_full_rank_and_each_dropped_column_is_in_their_span():
    cm = from_model(arm("generic6"), (0.12, 0, 0))
    irr = synthesize(cm, "position", strategy="BJR")
    Ja = scaled_jacobian(cm, random_configurations(cm, 80, seed=9), "position")
    S = Ja[:, irr.identified]
    assert np.linalg.matrix_rank(S) == S.shape[1] == 27
    coef = np.linalg.lstsq(S, Ja[:, ~irr.identified], rcond=None)[0]
    np.testing.assert_allclose(S @ coef, Ja[:, ~irr.identified], atol=1e-9)


def test_strategy_letters_are_checked():
    cm = from_model(arm("planar2r"))
    assert strategy_order(cm, "JL")[:2] == list(np.flatnonzero(cm.is_joint))
    for bad in ("", "JX", "LR", "JJL"):
        with pytest.raises(InputError, match="strategy"):
            strategy_order(cm, bad)
