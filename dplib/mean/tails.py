"""A Student-t tail model of the person means' deviations, fitted to a DP deviation profile.

The radius of the fine clip-and-noise stage trades the clipping bias, which depends on how far the
persons' means reach beyond it, against the Laplace noise, which grows with it. The private
deviation profile (:func:`dplib.mean.ranges.deviation_profile`) measures the survival
``S(x) = P(|Y - c| >= x)`` only where enough persons lie; beyond that, a model must say how the
tail goes on. A power law fitted where the profile stops measuring overstates light tails (a
Gaussian's log-log slope keeps steepening) and so gives radii several standard deviations too
wide. The Student-t family spans both cases: its survival is a power law of power ``nu`` far
out and tends to the Gaussian's as ``nu`` grows.

:func:`fit_student_tail` fits ``|Y - c| / s ~ |t_nu|`` to the measured survival points (weighted
least squares on ``log S``, weights the points' signal-to-noise ratios) and takes, beyond the
last measured edge ``x*``, ``S(x) = S(x*) S_t(x / s) / S_t(x* / s)``. ``nu_lower`` is the smallest
``nu`` whose best fit is within one unit of the minimum weighted residual (a one-sd profile
bound): the radius and the bias bound use it, so a tail the profile cannot tell apart from a
heavier one is treated as the heavier one. Everything here is post-processing of DP outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

#: Degrees of freedom searched (a t with nu = 1000 is a Gaussian for every radius we choose).
NU_MIN = 0.5
NU_MAX = 1000.0
#: Points of the measured survival used in the fit: those with S <= FIT_MAX_SURVIVAL.
FIT_MAX_SURVIVAL = 0.5
MIN_FIT_POINTS = 3
#: Cap on a point's weight (its SNR), so that the bulk does not swamp the tail points.
MAX_WEIGHT = 30.0


def _nu(log_nu: float) -> float:
    return math.exp(min(max(float(log_nu), math.log(NU_MIN)), math.log(NU_MAX)))


def t_abs_survival(u: np.ndarray | float, nu: float) -> np.ndarray:
    """``P(|T| >= u)`` for ``T ~ t_nu``."""
    # scipy's t.sf is stdtr(nu, -u) (bit for bit, tested); the ufunc skips stats' argument
    # handling, which dominated the tail fit's time (10^5 groups run it once each)
    return 2.0 * special.stdtr(nu, -np.asarray(u, dtype=float))


def t_pdf(u: np.ndarray | float, nu: float) -> np.ndarray:
    """Density of ``t_nu`` at ``u`` (finite ``nu > 0``): scipy's ``t._logpdf`` expression,
    ``exp(log poch(nu/2, 1/2) - (log nu + log pi)/2 - (nu + 1)/2 log1p(u^2/nu))``, without
    ``stats.t.pdf``'s generic argument handling (~20x faster per call; the grouped mean's radius
    search calls it once per group). Equal to ``stats.t.pdf`` to rounding (tested)."""
    u = np.asarray(u, dtype=float)
    if not math.isfinite(nu):
        return stats.t.pdf(u, nu)
    nu_ = np.float64(nu)
    with np.errstate(over="ignore"):  # u^2 beyond 1e308: log1p(inf) = inf, density 0
        return np.exp(np.log(special.poch(0.5 * nu_, 0.5)) - 0.5 * (np.log(nu_) + np.log(np.pi))
                      - (nu_ + 1) / 2 * np.log1p(u * u / nu_))


def t_abs_excess(u: float, nu: float) -> float:
    """``E[(|T| - u)+] = integral_u^inf P(|T| >= x) dx`` for ``T ~ t_nu``, ``u >= 0``; inf for nu <= 1.

    Closed form: ``2 [ (nu + u^2) / (nu - 1) f_nu(u) - u S_nu(u) ]`` (f, S the density and
    upper tail of ``t_nu``).
    """
    if nu <= 1.0:
        return math.inf
    val = 2.0 * ((nu + u * u) / (nu - 1.0) * float(t_pdf(u, nu)) - u * special.stdtr(nu, -u))
    return max(float(val), 0.0)


def t_abs_second_excess(u: float, nu: float) -> float:
    """``E[(T^2 - u^2)+] = integral_u^inf 2x P(|T| >= x) dx`` for ``T ~ t_nu``, ``u >= 0``; inf for nu <= 2.

    Closed form: ``nu (nu - 1) / (nu - 2) S_{nu-2}(u sqrt((nu - 2) / nu)) - (nu + u^2) S_nu(u)`` with
    ``S_v(x) = P(|t_v| >= x)`` (``t^2 f_nu(t)`` is a difference of two t kernels; checked against
    numerical integration in ``tests/unit/test_variance.py``).
    """
    if nu <= 2.0:
        return math.inf
    k = nu * (nu - 1.0) / (nu - 2.0)
    val = k * float(t_abs_survival(u * math.sqrt((nu - 2.0) / nu), nu - 2.0)) - (nu + u * u) * float(t_abs_survival(u, nu))
    return max(val, 0.0)


@dataclass(frozen=True)
class StudentTail:
    """Survival of ``|Y - c|``: measured steps up to ``x* = edges[-1]``, then a scaled t tail.

    Attributes
    ----------
    edges, survival : ndarray
        Measured edges (increasing, first 0) and the noisy survival at them (non-increasing).
    scale, nu : float
        The fitted t (data units, degrees of freedom).
    nu_lower : float
        One-sd lower bound on ``nu``; the tail beyond ``x*`` uses it.
    fitted : bool
        False when the profile measured too few tail points: ``nu`` is then the fallback.
    """

    edges: np.ndarray
    survival: np.ndarray
    scale: float
    nu: float
    nu_lower: float
    fitted: bool
    #: ``nu`` of the tail an error bar's bias bound takes beyond ``x*`` (nan: ``nu_lower``);
    #: set by :func:`dplib.mean.scale_free_stages.tail_from_profile`.
    nu_bar: float = math.nan

    def bias(self, radius: float) -> float:
        """Model bound on ``E[(|Y - c| - radius)+]``, data units (the largest clipping bias)."""
        xs, ss = self.edges, self.survival
        total = 0.0
        for j in range(len(xs) - 1):
            lo, hi = max(float(xs[j]), radius), float(xs[j + 1])
            if hi > lo:
                total += float(ss[j]) * (hi - lo)
        x_star, s_star = float(xs[-1]), float(ss[-1])
        if s_star <= 0:
            return total
        nu = self.nu_lower
        if nu <= 1.0:
            return math.inf
        u_star = x_star / self.scale
        u = max(radius, x_star) / self.scale
        base = float(t_abs_survival(u_star, nu))
        if base <= 0:
            return total
        return total + s_star * self.scale * t_abs_excess(u, nu) / base

    def survival_bound(self, x: float) -> float:
        """Model bound on ``P(|Y - c| >= x)``: the measured survival at the left edge of the step
        holding ``x`` (the survival does not increase, so it bounds every point of its step), and
        beyond ``x* = edges[-1]`` the t tail (``nu_lower``) scaled to the last measured survival;
        1 for ``x <= 0``."""
        xs, ss = self.edges, self.survival
        if not (x > 0):
            return 1.0
        x_star, s_star = float(xs[-1]), float(ss[-1])
        if x < x_star:
            j = int(np.searchsorted(xs, x, side="right")) - 1
            return float(min(max(ss[max(j, 0)], 0.0), 1.0))
        if s_star <= 0:
            return 0.0
        nu = self.nu_lower
        base = float(t_abs_survival(x_star / self.scale, nu)) if nu > 0 else 0.0
        if not (base > 0):
            return float(min(s_star, 1.0))
        return float(min(s_star * float(t_abs_survival(x / self.scale, nu)) / base, 1.0))

    def second_moment_excess(self, radius: float) -> float:
        """Model bound on ``E[(|Y - c|^2 - radius^2)+]``, data units squared: how much clipping at
        ``radius`` can lower the second moment about ``c`` (the variance's clipping bias).
        ``integral_radius^inf 2x S(x) dx`` with the measured steps (survival at each step's left
        edge) up to ``x*`` and the t tail (``nu_lower``) beyond; inf for ``nu_lower <= 2``."""
        xs, ss = self.edges, self.survival
        total = 0.0
        for j in range(len(xs) - 1):
            lo, hi = max(float(xs[j]), radius), float(xs[j + 1])
            if hi > lo:
                total += float(ss[j]) * (hi - lo) * (hi + lo)
        x_star, s_star = float(xs[-1]), float(ss[-1])
        if s_star <= 0:
            return total
        nu = self.nu_lower
        if nu <= 2.0:
            return math.inf
        u_star = x_star / self.scale
        u = max(radius, x_star) / self.scale
        base = float(t_abs_survival(u_star, nu))
        if base <= 0:
            return total
        return total + s_star * self.scale * self.scale * t_abs_second_excess(u, nu) / base

    def truncated_second_moment(self, radius: float) -> float:
        """A guess of ``E[min(|Y - c|, radius)^2]`` (accuracy only: weights of a release): the
        measured steps up to ``radius``, the last measured survival beyond ``x*``."""
        xs, ss = self.edges, self.survival
        total = 0.0
        for j in range(len(xs) - 1):
            lo, hi = float(xs[j]), min(float(xs[j + 1]), radius)
            if hi > lo:
                total += float(ss[j]) * (hi - lo) * (hi + lo)
        x_star = float(xs[-1])
        if radius > x_star:
            total += float(ss[-1]) * (radius - x_star) * (radius + x_star)
        return total


    def biases(self, radii: np.ndarray) -> np.ndarray:
        """:meth:`bias` at each radius (same operations in the same order per radius, vectorised
        over the radii: equal to the scalar results)."""
        r = np.asarray(radii, dtype=float)
        xs, ss = self.edges, self.survival
        total = np.zeros_like(r)
        for j in range(len(xs) - 1):
            hi = float(xs[j + 1])
            lo = np.maximum(float(xs[j]), r)
            total = np.where(hi > lo, total + float(ss[j]) * (hi - lo), total)
        x_star, s_star = float(xs[-1]), float(ss[-1])
        if s_star <= 0:
            return total
        nu = self.nu_lower
        if nu <= 1.0:
            return np.full_like(r, math.inf)
        u_star = x_star / self.scale
        base = float(t_abs_survival(u_star, nu))
        if base <= 0:
            return total
        u = np.maximum(r, x_star) / self.scale
        excess = np.maximum(2.0 * ((nu + u * u) / (nu - 1.0) * t_pdf(u, nu) - u * special.stdtr(nu, -u)), 0.0)
        return total + s_star * self.scale * excess / base


def _objective(theta: np.ndarray, lx: np.ndarray, ly: np.ndarray, w: np.ndarray, nu_fixed: float | None) -> float:
    ls = theta[0]
    nu = nu_fixed if nu_fixed is not None else _nu(theta[1])
    model = np.log(np.maximum(t_abs_survival(np.exp(lx - ls), nu), 1e-300))
    return float(np.sum((w * (ly - model)) ** 2))


def fit_student_tail(edges: np.ndarray, survival: np.ndarray, snr: np.ndarray, fallback_nu: float) -> StudentTail:
    """Fit :class:`StudentTail` to measured survival points (post-processing only).

    Parameters
    ----------
    edges, survival, snr : ndarray, same length
        Measured edges (first 0), their noisy survival (non-increasing, ``survival[0] = 1``) and
        the signal-to-noise ratio of each survival count.
    fallback_nu : float
        ``nu`` (and ``nu_lower``) when fewer than :data:`MIN_FIT_POINTS` points have
        ``0 < S <= FIT_MAX_SURVIVAL``; the scale is then the last measured edge over the t's
        quantile at the last measured survival.
    """
    xs, ss, snr = np.asarray(edges, float), np.asarray(survival, float), np.asarray(snr, float)
    pick = np.nonzero((xs > 0) & (ss > 0) & (ss <= FIT_MAX_SURVIVAL))[0]
    if pick.size < MIN_FIT_POINTS:
        x_star, s_star = float(xs[-1]), float(ss[-1])
        if x_star > 0 and 0 < s_star < 1:
            scale = x_star / float(stats.t.isf(s_star / 2.0, fallback_nu))
        else:
            scale = max(x_star, float(xs[1]) if xs.size > 1 else 1.0)
        return StudentTail(xs, ss, scale, fallback_nu, fallback_nu, False)
    lx, ly = np.log(xs[pick]), np.log(ss[pick])
    w = np.minimum(snr[pick], MAX_WEIGHT)
    start = np.array([float(np.median(lx)), math.log(5.0)])
    res = optimize.minimize(_objective, start, args=(lx, ly, w, None), method="Nelder-Mead",
                            options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 2000})
    ls_hat, nu_hat = float(res.x[0]), _nu(res.x[1])
    best = float(res.fun)
    # one-sd profile bound: the smallest nu whose best scale fits within best + 1
    nu_lower = nu_hat
    for nu in np.exp(np.linspace(math.log(nu_hat), math.log(NU_MIN), 40))[1:]:
        r = optimize.minimize_scalar(lambda a: _objective(np.array([a]), lx, ly, w, float(nu)),
                                     bounds=(ls_hat - 5.0, ls_hat + 5.0), method="bounded")
        if float(r.fun) > best + 1.0:
            break
        nu_lower = float(nu)
    return StudentTail(xs, ss, math.exp(ls_hat), nu_hat, nu_lower, True)


def _binned_objective(theta, lo, hi, raw, var_floor, nu_fixed=None):
    # theta[0] is log(scale / lo[0]): scale-free, so a power-of-two rescaling of the data gives
    # exactly the same optimisation path
    ls, ln_n = theta[0] + math.log(lo[0]), theta[-1]
    nu = nu_fixed if nu_fixed is not None else _nu(theta[1])
    with np.errstate(over="ignore"):
        s_lo = t_abs_survival(np.exp(np.log(lo) - ls), nu)
        s_hi = np.where(np.isinf(hi), 0.0, t_abs_survival(np.exp(np.log(np.where(np.isinf(hi), 1.0, hi)) - ls), nu))
    base = s_lo[0]
    if base <= 0:
        return 1e300
    pred = math.exp(min(ln_n, 700.0)) * (s_lo - s_hi) / base
    return float(np.sum((raw - pred) ** 2 / (var_floor + np.maximum(pred, 0.0))))


def fit_student_tail_binned(edges: np.ndarray, raw: np.ndarray, epsilon: float, fallback_nu: float,
                            survival_edges: np.ndarray, survival: np.ndarray) -> StudentTail:
    """Fit the t tail to the raw noisy counts of the profile's bins beyond its median.

    ``edges`` (length ``len(raw) + 1``, last inf) and ``raw`` are the deviation profile's bin
    edges and noisy counts. The fitted bins start at the first edge where the measured survival
    is at most :data:`FIT_MAX_SURVIVAL` and run to the top (empty-looking bins too: their noisy
    counts say the tail ends). Each bin's count is modelled as ``N (S(e_j) - S(e_j+1)) / S(e_0)``
    with ``S`` the survival of ``s |t_nu|``; weighted least squares with variance
    ``2 / epsilon^2 + prediction`` (Laplace plus Poisson). Post-processing only.
    """
    xs, ss = np.asarray(survival_edges, float), np.asarray(survival, float)
    start_idx = np.nonzero((xs > 0) & (ss <= FIT_MAX_SURVIVAL))[0]
    if start_idx.size == 0 or xs.size < 2:
        return fit_student_tail(xs, ss, np.full(xs.shape, MAX_WEIGHT), fallback_nu)
    e0 = float(xs[start_idx[0]])
    j0 = int(np.searchsorted(edges, e0, side="left"))
    lo, hi, r = edges[j0:-1], edges[j0 + 1:], np.asarray(raw[j0:], float)
    if lo.size < MIN_FIT_POINTS:
        return fit_student_tail(xs, ss, np.full(xs.shape, MAX_WEIGHT), fallback_nu)
    var_floor = 2.0 / epsilon**2
    n_tail = max(float(np.sum(r)), 1.0)
    best = None
    for nu0 in (1.5, 4.0, 30.0):
        start = np.array([0.0, math.log(nu0), math.log(n_tail)])
        res = optimize.minimize(_binned_objective, start, args=(lo, hi, r, var_floor), method="Nelder-Mead",
                                options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 3000})
        if best is None or res.fun < best.fun:
            best = res
    ls_hat, nu_hat = float(best.x[0]) + math.log(lo[0]), _nu(best.x[1])  # type: ignore[union-attr]  # set by the first of the three fits
    ln_hat, f_best = float(best.x[2]), float(best.fun)  # type: ignore[union-attr]  # set by the first of the three fits
    nu_lower = nu_hat
    for nu in np.exp(np.linspace(math.log(nu_hat), math.log(NU_MIN), 30))[1:]:
        r2 = optimize.minimize(lambda th: _binned_objective(th, lo, hi, r, var_floor, float(nu)),
                               np.array([ls_hat - math.log(lo[0]), ln_hat]), method="Nelder-Mead",
                               options={"xatol": 1e-3, "fatol": 1e-4})
        if float(r2.fun) > f_best + 1.0:
            break
        nu_lower = float(nu)
    return StudentTail(xs, ss, math.exp(ls_hat), nu_hat, nu_lower, True)
