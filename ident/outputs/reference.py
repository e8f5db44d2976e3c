"""The identified base parameters beside a reference model's (the CAD model, the model a simulator runs): the
difference of each in units of its identified standard deviation, flagged beyond REFERENCE_SIGMA."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ident.errors import InputError
from ident.model import Model

REFERENCE_SIGMA = 3.0   # a base parameter further than this many identified std from the reference is flagged


@dataclass(frozen=True, eq=False)
class ReferenceComparison:
    """The identified base parameters against a reference model's.

    Attributes
    ----------
    model_name : str
        The reference as the user named it (its file's name, or a shipped model's name).
    names : list of str
        The base parameters' names.
    identified, std, reference : ndarray (b,)
        Identified value, its standard deviation and the reference model's value, in SI units.
    sigma_difference : ndarray (b,)
        (identified - reference) / std (inf where std is 0 and the values differ).
    flagged : ndarray of bool (b,)
        |identified - reference| > REFERENCE_SIGMA std.
    """

    model_name: str
    names: list[str]
    identified: np.ndarray
    std: np.ndarray
    reference: np.ndarray
    sigma_difference: np.ndarray
    flagged: np.ndarray

    @property
    def within(self) -> int:
        """How many base parameters lie within REFERENCE_SIGMA std of the reference."""
        return int(np.count_nonzero(~self.flagged))


def compare_with_reference(ident, reference: Model, label: str | None = None) -> ReferenceComparison:
    """Compare an identification (ident.fit.batch.Identification) with the base parameters of a reference model of
    the same structure.

    Parameters
    ----------
    ident : ident.fit.batch.Identification
        The identification.
    reference : Model
        The reference model; it must have as many joints as the identified one.
    label : str, optional
        What to call the reference (model_name): the file's name the user passed. Default: the model's
        `[robot] name`, which two variants of one robot share.

    Returns
    -------
    ReferenceComparison

    Raises
    ------
    InputError
        When the reference has another number of joints.
    """
    if reference.n != ident.model.n:
        raise InputError(f"reference model {reference.name}: {reference.n} joints, the model {ident.model.name} "
                         f"has {ident.model.n}")
    values = ident.base.from_standard(reference.standard_parameters())
    beta, std = np.asarray(ident.fit.beta, float), np.asarray(ident.fit.std, float)
    diff = beta - values
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(diff == 0, 0.0, diff / std)
    return ReferenceComparison(label or reference.name, list(ident.base.names), beta, std, values, z,
                               np.abs(diff) > REFERENCE_SIGMA * std)
