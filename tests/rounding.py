"""Tolerances from the numerics: how far two computations equal in exact arithmetic may differ from rounding
alone, from the conditioning of the problem and the number of operations, as a test can compute them."""
from __future__ import annotations

import numpy as np

EPS = np.finfo(float).eps


def recursion_bound(P_prior, P, n_updates: int) -> float:
    """Relative (2-norm) difference that two recursive least-squares runs, equal in exact arithmetic, may show.

    A covariance update loses the digits by which P shrinks below its prior (Bierman, Factorization Methods
    for Discrete Sequential Estimation, ch. V): kappa = ||P_prior|| ||P^-1||, the covariance's range over the
    run, the conditioning the recursion works at. n_updates rounding errors of that size add up as
    sqrt(n_updates) (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019), each of machine epsilon."""
    kappa = np.linalg.norm(P_prior, 2) * np.linalg.norm(np.linalg.inv(P), 2)
    return float(kappa * np.sqrt(n_updates) * EPS)


def least_squares_bound(A, x, r) -> float:
    """Relative (2-norm) difference of two backward-stable solutions of min ||A x - b||: the perturbation bound
    kappa (2 + (kappa + 1) ||r|| / (||A|| ||x||)) times their backward errors, sqrt(m n) eps each for
    Householder QR or the SVD (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., thm. 20.1 and
    sec. 19.3, with sqrt for the probabilistic sum), A (m, n), r = b - A x."""
    return least_squares_bound_of(np.linalg.cond(A), np.linalg.norm(A, 2), np.linalg.norm(x), np.linalg.norm(r),
                                  *np.shape(A))


def least_squares_bound_of(kappa: float, norm_A: float, norm_x: float, norm_r: float, m: int, n: int) -> float:
    """least_squares_bound from the norms alone: for a recursive fit, whose stacked rows A are gone but whose
    information matrix A'A = P^-1 gives kappa = sqrt(cond(P)) and ||A|| = ||P^-1||^(1/2)."""
    eta = np.sqrt(m * n) * EPS
    return float(2 * eta * kappa * (2 + (kappa + 1) * norm_r / (norm_A * norm_x)))


def factorization_bound(n: int) -> float:
    """Relative (2-norm) backward error of a symmetric positive definite n x n matrix factored (Cholesky or
    U D U') and multiplied back: 4 n (3 n + 1) eps (Higham, thm. 10.5) plus n eps for the product."""
    return float((4 * n * (3 * n + 1) + n) * EPS)


def relative_difference(ours, reference) -> float:
    return float(np.linalg.norm(np.asarray(ours) - reference) / np.linalg.norm(reference))


def assert_equal_up_to_rounding(ours, reference, bound: float) -> None:
    """Relative 2-norm difference within `bound`."""
    err = relative_difference(ours, reference)
    assert err <= bound, f"relative difference {err:.3g} beyond the rounding bound {bound:.3g}"
