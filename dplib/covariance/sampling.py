"""Random draws of BHS23's release steps, all built from standard normals of a noise source.

The noise source (:mod:`dplib.mechanisms.noise`) is injected: :class:`SecureNoise` (OpenDP's
floating-point-safe Gaussian sampler) in releases, :class:`SeededNoise` in tests. Standard
normals are ``noise.add_gaussian(zeros, 1.0)``; everything else is a transformation of them:

- uniform on (0, 1): ``exp(-(Z1^2 + Z2^2)/2)`` (``Z1^2 + Z2^2 ~ Exp(1/2)``, exactly uniform in
  distribution) -- used by the PTR coin and the gamma rejection sampler;
- chi-square with nu degrees of freedom: the sum of nu squared normals for nu <= 64, else
  ``2 Gamma(nu/2)`` by the Marsaglia-Tsang (2000) rejection method (exact in distribution);
- N(mu, c^2 Sigma): ``mu + c A z`` with ``A = chol(Sigma)``;
- Wishart_d(N, I) by the Bartlett decomposition (N >= d) or ``Z^T Z`` (N < d).

**Not floating-point hardened.** The transformations are ordinary float64 arithmetic on secure
normals: the released mean and covariance are not protected against floating-point attacks of
the Mironov kind (docs/privacy/stable_covariance.md, "Randomness"; there is no vetted sampler of
N(mu, Sigma) with a data-dependent Sigma, nor of a Wishart). Threshold decisions are also float comparisons.
"""

from __future__ import annotations

import math

import numpy as np

from dplib.mechanisms.noise import NoiseSource

#: Degrees of freedom up to which a chi-square is drawn as a sum of squared normals.
CHI2_DIRECT_MAX = 64


def standard_normals(noise: NoiseSource, size: int) -> np.ndarray:
    """``size`` independent N(0, 1) draws from the noise source, shape ``(size,)``."""
    if size <= 0:
        return np.zeros(0)
    return np.asarray(noise.add_gaussian(np.zeros(size), 1.0), dtype=np.float64)


def uniforms(noise: NoiseSource, size: int) -> np.ndarray:
    """``size`` independent Uniform(0, 1) draws: ``exp(-(Z1^2 + Z2^2)/2)``."""
    z = standard_normals(noise, 2 * size).reshape(size, 2)
    return np.exp(-0.5 * (z * z).sum(axis=1))


def _gamma_mt(noise: NoiseSource, shape: float) -> float:
    """One Gamma(shape, 1) draw, shape >= 1 (Marsaglia & Tsang 2000)."""
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x, u = standard_normals(noise, 1)[0], uniforms(noise, 1)[0]
        v = (1.0 + c * x) ** 3
        if v > 0.0 and math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v


def chi_square(noise: NoiseSource, dof: int) -> float:
    """One chi-square draw with ``dof >= 1`` integer degrees of freedom."""
    if dof <= CHI2_DIRECT_MAX:
        z = standard_normals(noise, dof)
        return float(np.dot(z, z))
    return 2.0 * _gamma_mt(noise, dof / 2.0)


def ptr_pass_probability(z: float, epsilon: float, delta: float) -> float:
    """Pr[PASS] of M_PTR^{epsilon, delta} at score z (Claim 10)."""
    tau = 2.0 * math.log((1.0 - delta) / delta) / epsilon + 4.0
    if z == 0:
        return 1.0
    if z >= tau:
        return 0.0
    return 1.0 - delta * math.exp(epsilon / 2.0 * (z - 2.0))


def ptr(z: int, epsilon: float, delta: float, noise: NoiseSource) -> bool:
    """M_PTR^{epsilon, delta}(z): True = PASS (Claim 10, L402; proof Claim 58).

    z = 0 passes and z >= tau fails deterministically (no draw); otherwise PASS iff U < p with
    ``p = 1 - delta exp((epsilon/2)(z - 2))``.

    Privacy
    -------
    (epsilon, delta)-DP when z is 2-sensitive, epsilon <= 1 and delta <= epsilon/10.
    """
    p = ptr_pass_probability(z, epsilon, delta)
    if p in (0.0, 1.0):
        return p == 1.0
    return bool(uniforms(noise, 1)[0] < p)


def gaussian_draw(mu: np.ndarray, sigma: np.ndarray, c: float, noise: NoiseSource) -> np.ndarray:
    """One draw of N(mu, c^2 Sigma): ``mu + c chol(Sigma) z`` (Sigma positive definite).

    Falls back to the symmetric square root (same law) if the Cholesky factorisation fails.
    """
    d = mu.shape[0]
    try:
        a = np.linalg.cholesky(sigma)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(sigma)
        a = v * np.sqrt(np.clip(w, 0.0, None))[None, :]
    return mu + c * (a @ standard_normals(noise, d))


def wishart_identity(d: int, dof: int, noise: NoiseSource) -> np.ndarray:
    """One draw of Wishart_d(dof, I): Bartlett (``L L^T``, ``L_ii = sqrt(chi2_{dof-i})``,
    ``L_ij ~ N(0,1)`` below the diagonal, i = 0..d-1) when ``dof >= d``, else ``Z^T Z``."""
    if dof < d:
        z = standard_normals(noise, dof * d).reshape(dof, d)
        return z.T @ z
    low = np.zeros((d, d))
    below = np.tril_indices(d, -1)
    low[below] = standard_normals(noise, len(below[0]))
    for i in range(d):
        low[i, i] = math.sqrt(chi_square(noise, dof - i))
    return low @ low.T


def wishart_release(sigma: np.ndarray, N: int, noise: NoiseSource) -> np.ndarray:
    """``(1/N) sum_{t<=N} Z_t Z_t^T`` with ``Z_t ~ N(0, Sigma)`` iid, drawn as ``A (W/N) A^T``
    with ``A = chol(Sigma)`` and ``W ~ Wishart_d(N, I)`` (Algorithm 5.1). Symmetrised."""
    d = sigma.shape[0]
    try:
        a = np.linalg.cholesky(sigma)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(sigma)
        a = v * np.sqrt(np.clip(w, 0.0, None))[None, :]
    out = a @ (wishart_identity(d, N, noise) / N) @ a.T
    return 0.5 * (out + out.T)
