"""URDF import: chain selection, fixed-joint merging, limits, and one clear error for each broken file."""
import math

import numpy as np
import pytest

from ident.model import ModelError, load_model

ARM = """<robot name="mini">
  <link name="base"/>
  <link name="l1"><inertial><origin xyz="0 0 0.1"/><mass value="2"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.005"/></inertial></link>
  <link name="l2"><inertial><origin xyz="0.1 0 0" rpy="0 0.3 0"/><mass value="1"/>
    <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.003" iyz="0" izz="0.003"/></inertial></link>
  <link name="tool"><inertial><mass value="0.5"/>
    <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial></link>
  <joint name="j1" type="continuous"><parent link="base"/><child link="l1"/><axis xyz="0 0 1"/></joint>
  <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/>
    <origin xyz="0 0 0.2" rpy="1.5707963 0 0"/><axis xyz="0 1 0"/>
    <limit lower="-2" upper="2" velocity="3" effort="40"/></joint>
  <joint name="flange" type="fixed"><parent link="l2"/><child link="tool"/><origin xyz="0.3 0 0"/></joint>
</robot>"""


def write(tmp_path, text):
    p = tmp_path / "arm.urdf"
    p.write_text(text)
    return p


def test_chain_limits_and_merged_tool(tmp_path):
    m = load_model(write(tmp_path, ARM))
    assert m.name == "mini" and m.joint_names == ("j1", "j2") and m.n == 2
    assert m.q_min[0] == -math.inf and m.q_max[0] == math.inf        # continuous
    assert (m.q_min[1], m.q_max[1], m.qd_max[1], m.tau_max[1]) == (-2, 2, 3, 40)
    assert m.qdd_max[1] == math.inf and m.drive.sum() == 0 and m.gear_ratio.tolist() == [1, 1]
    # the fixed tool is merged into link 2: total mass and first moment about the link-2 origin
    assert m.inertial[1, 9] == pytest.approx(1.5)
    np.testing.assert_allclose(m.inertial[1, 6:9], [1 * 0.1 + 0.5 * 0.3, 0, 0], atol=1e-12)
    np.testing.assert_allclose(m.flange_p, [0, 0, 0])  # default tip: the child of the last movable joint
    tool = load_model(write(tmp_path, ARM), tip="tool")
    np.testing.assert_allclose(tool.flange_p, [0.3, 0, 0])
    np.testing.assert_allclose(tool.inertial, m.inertial)


def test_branching_chain_needs_a_tip(tmp_path):
    text = ARM.replace("</robot>", """<link name="finger"/>
      <joint name="f" type="prismatic"><parent link="l1"/><child link="finger"/><axis xyz="1 0 0"/>
      <limit lower="0" upper="0.04" velocity="0.1" effort="10"/></joint></robot>""")
    with pytest.raises(ModelError, match="candidates: finger, l2"):
        load_model(write(tmp_path, text))
    m = load_model(write(tmp_path, text), tip="l2")
    assert m.joint_names == ("j1", "j2")


@pytest.mark.parametrize("old,new,field", [
    ('<mass value="2"/>', '<mass value="-2"/>', "link[l1].inertial.mass"),
    ('<mass value="2"/>', '<mass value="two"/>', "link[l1].inertial.mass.value"),
    ('<origin xyz="0 0 0.2"', '<origin xyz="0 0.2"', "joint[j2].origin.xyz"),
    ('type="revolute"', 'type="floating"', "joint[j2].type"),
    ('<child link="l2"/>', '<child link="l9"/>', "joint[j2].child"),
    ('<axis xyz="0 1 0"/>', '<axis xyz="0 0 0"/>', "joint[j2].axis.xyz"),
    ('<robot name="mini">', '<robot name="mini"', "(syntax)"),
    ('ixx="0.002"', '', "link[l2].inertial.inertia.ixx"),
    ('iyy="0.003"', 'iyy="0.009"', "link[l2].inertial.inertia"),       # triangle inequality, as TOML refuses it
    ('izz="0.005"', 'izz="-0.005"', "link[l1].inertial.inertia"),      # a negative principal moment
    ("</robot>", '<joint name="back" type="fixed"><parent link="tool"/><child link="l1"/></joint></robot>',
     "joint[back].child"),                                              # l1 with two parents: no tree
    ("</robot>", '<link name="a"/><link name="b"/><joint name="ab" type="fixed"><parent link="a"/><child link="b"/>'
                 '</joint><joint name="ba" type="fixed"><parent link="b"/><child link="a"/></joint></robot>',
     "joint[ba]"),                                                      # a cycle beside the tree (walked forever)
])
def test_broken_urdf_names_the_element(tmp_path, old, new, field):
    text = ARM.replace(old, new, 1)
    assert text != ARM
    with pytest.raises(ModelError) as err:
        load_model(write(tmp_path, text))
    assert err.value.field == field
    assert str(tmp_path / "arm.urdf") in str(err.value)


def test_unknown_tip(tmp_path):
    with pytest.raises(ModelError, match=r"\(tip\)"):
        load_model(write(tmp_path, ARM), tip="nowhere")


def test_toml_adds_drives_and_limits_to_a_urdf(tmp_path):
    write(tmp_path, ARM)
    toml = tmp_path / "arm.toml"
    toml.write_text('[robot]\nurdf = "arm.urdf"\ntip = "tool"\n\n[[joint]]\nname = "j2"\n'
                    'drive = { Ia = 0.1, fc = 1.0, gear_ratio = 50.0, torque_constant = 0.1 }\nlimits = { qdd = 5.0 }\n')
    m = load_model(toml)
    np.testing.assert_allclose(m.drive[1], [0.1, 1.0, 0.0, 0.0])
    assert m.qdd_max[1] == 5.0 and m.q_max[1] == 2.0 and m.gear_ratio[1] == 50.0
    np.testing.assert_allclose(m.flange_p, [0.3, 0, 0])
    toml.write_text('[robot]\nurdf = "arm.urdf"\n\n[[joint]]\nname = "j7"\n')
    with pytest.raises(ModelError, match=r"joint\[0\].name.*j1, j2"):
        load_model(toml)


def test_the_flange_frame_is_named_and_a_tip_is_honoured_or_refused(tmp_path):
    """Model.flange_frame names the frame payloads and tool points are given in: the URDF's tip link (the
    end of the movable chain by default), "flange" for a model file's [robot] flange; a tip given to a
    model file with a URDF overrides its [robot] tip, and one given to a model file without a URDF is
    refused rather than ignored."""
    urdf = write(tmp_path, ARM)
    assert load_model(urdf).flange_frame == "l2"
    assert load_model(urdf, tip="tool").flange_frame == "tool"
    toml = tmp_path / "arm.toml"
    toml.write_text('[robot]\nurdf = "arm.urdf"\ntip = "tool"\n')
    assert load_model(toml).flange_frame == "tool"
    over = load_model(toml, tip="l2")
    assert over.flange_frame == "l2"
    np.testing.assert_allclose(over.flange_p, [0, 0, 0])
    toml.write_text('[robot]\nurdf = "arm.urdf"\ntip = "tool"\nflange = { xyz = [0.0, 0.0, 0.05] }\n')
    m = load_model(toml)
    assert m.flange_frame == "flange"
    np.testing.assert_allclose(m.flange_p, [0.3, 0, 0.05])
    assert load_model("generic6").flange_frame == "flange"
    with pytest.raises(ModelError, match=r"generic6\.toml: \(tip\).*'tool0'"):
        load_model("generic6", tip="tool0")
