"""The TOML model format: shipped models load, and every broken file gives one error naming file and field."""
import numpy as np
import pytest

from ident.model import spatial
from ident.model import ModelError, load_model, shipped_models

GOOD = """
[robot]
name = "two"
gravity = [0.0, 0.0, -9.81]
flange = { xyz = [0.0, 0.0, 0.1] }

[[joint]]
name = "a"
type = "revolute"
dh = { alpha = 0.0, d = 0.0, theta = 0.0, r = 0.0 }
link = { mass = 2.0, com = [0.1, 0.0, 0.0], inertia_com = [0.01, 0.0, 0.0, 0.02, 0.0, 0.02] }
drive = { Ia = 0.1, fc = 1.0, fv = 0.5, offset = 0.1, gear_ratio = 50.0, torque_constant = 0.1 }
limits = { q = [-3.0, 3.0], qd = 2.0, qdd = 10.0, tau = 40.0 }

[[joint]]
name = "b"
type = "prismatic"
origin = { xyz = [0.3, 0.0, 0.0], rpy = [0.0, 1.5707963267948966, 0.0] }
axis = [0.0, 0.0, 1.0]
link = { mass = 1.0, com = [0.0, 0.0, 0.05], inertia_origin = [0.01, 0.0, 0.0, 0.01, 0.0, 0.005] }
limits = { q = [0.0, 0.2], qd = 0.5, qdd = 2.0, tau = 100.0 }
"""


def write(tmp_path, text):
    p = tmp_path / "arm.toml"
    p.write_text(text)
    return p


def test_shipped_models_load_with_their_sizes():
    assert {"generic6", "puma560"} <= set(shipped_models())
    for name in ("generic6", "puma560"):
        m = load_model(name)
        assert m.n == 6 and m.is_dh
        assert m.standard_parameters().shape == (84,)
        assert len(m.parameter_names()) == 84
        assert m.parameter_names()[:3] == ["XX1", "XY1", "XZ1"] and m.parameter_names()[-1] == "offset6"


def test_generic6_geometry_is_the_seed_000_table():
    m = load_model("generic6")
    H = np.pi / 2
    expected = [[0, 0, 0, 0], [-H, 0, -H, 0], [0, 0.25, 0, 0], [-H, 0, 0, 0.25], [-H, 0, 0, 0], [-H, 0, 0, 0]]
    np.testing.assert_allclose(m.dh, expected, atol=1e-15)


def test_toml_values_reach_the_model(tmp_path):
    m = load_model(write(tmp_path, GOOD))
    assert m.n == 2 and m.joint_names == ("a", "b") and not m.is_dh
    # inertia_com is shifted to the link origin: YY = 0.02 + m*cx^2
    np.testing.assert_allclose(m.inertial[0], [0.01, 0, 0, 0.02 + 2 * 0.01, 0, 0.02 + 2 * 0.01, 0.2, 0, 0, 2.0])
    np.testing.assert_allclose(m.inertial[1], [0.01, 0, 0, 0.01, 0, 0.005, 0, 0, 0.05, 1.0])
    np.testing.assert_allclose(m.drive[0], [0.1, 1.0, 0.5, 0.1])
    np.testing.assert_allclose(m.drive[1], [0, 0, 0, 0])
    assert m.joint_type.tolist() == [0, 1]
    np.testing.assert_allclose(m.placement_R[1], spatial.rot_y(np.pi / 2), atol=1e-15)
    np.testing.assert_allclose(m.flange_p, [0, 0, 0.1])
    np.testing.assert_allclose(m.joint_torque_per_amp(), [5.0, 1.0])
    assert m.q_max[1] == 0.2 and m.qdd_max[0] == 10.0


def test_model_is_immutable():
    m = load_model("generic6")
    with pytest.raises(ValueError):
        m.inertial[0, 0] = 1.0


@pytest.mark.parametrize("old,new,field", [
    ('type = "revolute"', 'type = "spherical"', "joint[0].type"),
    ("mass = 2.0", "mass = -2.0", "joint[0].link.mass"),
    ("qd = 2.0", "qd = 0.0", "joint[0].limits.qd"),
    ("q = [-3.0, 3.0]", "q = [3.0, -3.0]", "joint[0].limits.q"),
    ("q = [-3.0, 3.0]", "q = [-3.0]", "joint[0].limits.q"),
    ("gear_ratio = 50.0", "gear_ratio = 0.0", "joint[0].drive.gear_ratio"),
    ('torque_constant = 0.1', 'torque_constant = "x"', "joint[0].drive.torque_constant"),
    ("inertia_com = [0.01, 0.0, 0.0, 0.02, 0.0, 0.02]", "inertia_com = [0.01, 0.0, 0.0, 0.02, 0.0, 0.5]", "joint[0].link"),
    (", inertia_com = [0.01, 0.0, 0.0, 0.02, 0.0, 0.02]", "", "joint[0].link.inertia_com"),
    ("dh = { alpha = 0.0, d = 0.0, theta = 0.0, r = 0.0 }", "", "joint[0].dh"),
    ("axis = [0.0, 0.0, 1.0]", "axis = [0.0, 0.0, 0.0]", "joint[1].axis"),
    ('gravity = [0.0, 0.0, -9.81]', 'gravity = [0.0, nan, -9.81]', "robot.gravity"),
    ("limits = { q = [0.0, 0.2], qd = 0.5, qdd = 2.0, tau = 100.0 }", "", "joint[1].limits"),
    ("[robot]", "[robut]", "robut"),                 # a misspelt table is named as unknown
    ('name = "a"', 'name = "a"\nname = "b"', "(syntax)"),
    ("mass = 2.0", "mas = 2.0, mass = 2.0", "joint[0].link.mas"),          # unknown keys are refused, not ignored
    ("qd = 2.0", "qd = 2.0, qdd_max = 9.0", "joint[0].limits.qdd_max"),
    ("gear_ratio = 50.0", "gear_ratio = 50.0, gear = 2.0", "joint[0].drive.gear"),
    ("[robot]", '[robot]\ntip = "flange"', "robot.tip"),                   # tip only with a urdf
    ("gear_ratio = 50.0", "gear_ratio = 1e300", "joint[0].drive.gear_ratio"),  # finite, but no arm's number
])
def test_broken_file_names_the_field(tmp_path, old, new, field):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    with pytest.raises(ModelError) as err:
        load_model(write(tmp_path, text))
    assert err.value.field == field
    assert str(tmp_path / "arm.toml") in str(err.value)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(ModelError, match="an existing file"):
        load_model(tmp_path / "none.toml")
    with pytest.raises(ModelError, match="generic6"):
        load_model("no_such_model")


def test_cli_reports_a_bad_file_in_one_line(tmp_path, capsys):
    from armid.cli import main

    assert main(["model", "show", str(write(tmp_path, GOOD.replace("mass = 2.0", "mass = -1.0")))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "joint[0].link.mass" in err[0]


def test_cli_shows_model_and_base_parameters(capsys):
    from armid.cli import main

    assert main(["model", "show", "puma560", "--base", "closed-form"]) == 0
    out = capsys.readouterr().out
    assert "58 base parameters (closed-form) of 84 standard" in out
    assert "XXR2 = XX2 - YY2 - 0.186451*m3" in out
