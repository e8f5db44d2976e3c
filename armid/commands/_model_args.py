"""The arguments that name a robot model and its flange frame, shared by the commands that take a model
with a frame (`payload`, `calibrate`): `--model` and `--tip`, read by ident.model.load_model."""
from __future__ import annotations

import argparse

MODEL_HELP = "a .toml or .urdf model file, or a shipped model (generic6, puma560)"
TIP_HELP = ("the flange frame: a link of the URDF (default: the end of its movable chain); a model file "
            "without a URDF has its [robot] flange")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Add --model (required) and --tip LINK to a command's parser."""
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--tip", default="", metavar="LINK", help=TIP_HELP)


def load_model_argument(args: argparse.Namespace):
    """The ident.model.Model of --model with --tip as its flange frame (`Model.flange_frame` names it)."""
    from ident.model import load_model

    return load_model(args.model, tip=args.tip)


def frame_text(model) -> str:
    """How the commands name the flange frame in their output: 'tool0 (ur5)'."""
    return f"{model.flange_frame} ({model.name})"
