"""The exponential mechanism over a finite candidate set (report-noisy-max with Gumbel noise).

Built in two steps, so that everything that can fail fails before any budget is spent:

1. :class:`ExponentialMechanism` is constructed from **public** inputs only (epsilon, the
   score's sensitivity, whether the scores are integers, the noise source). For the secure
   source this builds OpenDP's ``make_noisy_max`` measurement and checks its privacy map; a
   job builds it before the ledger reservation.
2. :meth:`ExponentialMechanism.sample` takes the (data-dependent) scores. It never refuses
   them: they pass through :func:`clamp_scores`, a fixed total map into a finite range, and
   are then sampled. A score vector is never inspected to decide whether or how to run.

Privacy: with scores of sensitivity ``Delta`` (every candidate's score moves by at most
``Delta`` between neighbours), output ``i`` with probability ``prop. exp(epsilon s_i / (2
Delta))`` is epsilon-DP (McSherry & Talwar 2007). Report-noisy-max with Gumbel noise of scale
``2 Delta / epsilon`` samples exactly this distribution. :func:`clamp_scores` is 1-Lipschitz per
coordinate, so the clamped scores have sensitivity ``Delta`` too.

Sources: OpenDP 0.16 ``make_noisy_max`` (its ``zero_concentrated_divergence`` variant is the
Gumbel one; the ``max_divergence`` variant adds exponential noise, i.e. permute-and-flip, a
different distribution). Used by P3 (:mod:`dplib.distribution.p3`: Kamath, Majid, Moitra, Mouzakis, Ullman,
Algorithm 4.1's sampling step on a finite grid) and by the pure-DP reference
(:mod:`dplib.mean.pure_reference`: Agarwal et al. 2024, Algorithm 7 with Lemma 2.9).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import opendp.prelude as dp

from dplib.errors import InvalidParameterError
from dplib.mechanisms.noise import NoiseSource

#: Scores are clamped into ``[-SCORE_BOUND, SCORE_BOUND]`` (NaN to ``-SCORE_BOUND``, the least
#: likely value) before sampling. ``2**62`` fits OpenDP's i64 path and is far above any score
#: used here (P3: at most ``(1 + g)`` times its capped number of persons; the pure-DP reference:
#: a number of persons).
SCORE_BOUND = 2**62
#: Relative slack of the calibration check of OpenDP's privacy map (its map rounds up).
_MAP_TOLERANCE = 1e-9


def _check_positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidParameterError(f"{name} must be a finite real number > 0, got {value!r}")
    return float(value)


def clamp_scores(scores, integer_scores: bool = False) -> np.ndarray:
    """The fixed total map applied to scores before the mechanism sees them.

    Float scores: NaN -> ``-SCORE_BOUND``, then clipped to ``[-SCORE_BOUND, SCORE_BOUND]``
    (+-inf land on the bounds). Integer scores: clipped to the same range (int64).

    Parameters
    ----------
    scores : array_like, shape (n_candidates,)
    integer_scores : bool
        Public: the scores' type, fixed by the caller's code (never by their values).

    Returns
    -------
    ndarray of shape (n_candidates,), float64 or int64.

    Raises
    ------
    InvalidParameterError
        Integer mode given non-integer-typed scores, or a shape that is not a non-empty vector
        (the number of candidates is public: a grid fixed before the data is read).

    Privacy
    -------
    1-Lipschitz in every coordinate (and the identity on scores inside the range), so the
    clamped scores keep the sensitivity of the raw ones.
    """
    arr = np.asarray(scores)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidParameterError("scores must be a non-empty 1-D vector (one per candidate)")
    if integer_scores:
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidParameterError(f"integer_scores=True needs an integer array of scores, got dtype {arr.dtype}")
        return np.clip(arr.astype(np.int64), -SCORE_BOUND, SCORE_BOUND)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidParameterError(f"scores must be real numbers, got dtype {arr.dtype}")
    bound = float(SCORE_BOUND)
    out = np.nan_to_num(arr.astype(np.float64), nan=-bound, posinf=bound, neginf=-bound)
    return np.clip(out, -bound, bound)


def _logits(scores: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    """``epsilon (s - max s) / (2 Delta)``: shifted first, so the product never overflows."""
    s = scores.astype(np.float64)
    return epsilon * (s - s.max()) / (2.0 * sensitivity)


@functools.lru_cache(maxsize=64)
def _opendp_gumbel_max(integer_scores: bool, scale: float):
    """OpenDP report-noisy-max with Gumbel noise of ``scale`` (built once per (type, scale)).

    The float domain must be declared non-NaN: OpenDP's ``make_noisy_max`` refuses a float
    domain that admits NaN ("input_domain elements must be non-nan"), which is what made every
    P3 release with the secure source fail after its budget was charged (issue 19)."""
    dp.enable_features("contrib")
    if integer_scores:
        space = dp.vector_domain(dp.atom_domain(T="i64")), dp.linf_distance(T="i64")
    else:
        space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float)
    return dp.m.make_noisy_max(*space, dp.zero_concentrated_divergence(), scale=scale)


class ExponentialMechanism:
    """The exponential mechanism with a fixed budget, sensitivity and noise source.

    Parameters
    ----------
    epsilon : float
        Budget of one draw (pure DP).
    noise : NoiseSource
        ``SecureNoise`` (``noise.secure``): OpenDP ``make_noisy_max`` (Gumbel), built and
        calibration-checked here; a seeded source with an ``rng`` Generator (tests only):
        ``argmax(logits + rng.gumbel())``.
    sensitivity : float, default 1
        ``Delta``: the largest change of any candidate's score between neighbours.
    integer_scores : bool, default False
        Public declaration of the scores' type: True runs OpenDP's i64 path (``Delta`` must then
        be an integer) and :meth:`sample` takes integer arrays only.

    Raises
    ------
    InvalidParameterError
        Bad epsilon or sensitivity, a non-integer sensitivity with integer scores, a noise
        source that is neither secure nor seeded, OpenDP refusing to build the measurement
        (chained), or an OpenDP map that does not give the calibrated ``rho = epsilon^2 / 8``
        (all public: nothing here reads data).

    Privacy
    -------
    Each :meth:`sample` is epsilon-DP when the scores have sensitivity ``Delta`` (McSherry &
    Talwar 2007). As a calibration check OpenDP's own map must give ``rho = epsilon^2 / 8`` at
    ``d_in = Delta``: the bounded-range bound of an epsilon-DP exponential mechanism.
    """

    def __init__(self, epsilon: float, noise: NoiseSource, *, sensitivity: float = 1.0,
                 integer_scores: bool = False) -> None:
        self.epsilon = _check_positive(epsilon, "epsilon")
        self.sensitivity = _check_positive(sensitivity, "sensitivity")
        self.integer_scores = bool(integer_scores)
        if self.integer_scores and self.sensitivity != int(self.sensitivity):
            raise InvalidParameterError(f"integer scores need an integer sensitivity, got {sensitivity!r}")
        self.noise = noise
        self.scale = 2.0 * self.sensitivity / self.epsilon
        self._measurement = None
        if getattr(noise, "secure", False):
            d_in = int(self.sensitivity) if self.integer_scores else self.sensitivity
            try:
                meas = _opendp_gumbel_max(self.integer_scores, self.scale)
                rho = meas.map(d_in)
            except Exception as exc:  # OpenDP's own errors (public parameters only, no data)
                detail = " ".join(str(exc).split())[:300]
                raise InvalidParameterError(f"OpenDP could not build the exponential mechanism: {detail}") from exc
            if not rho <= self.epsilon**2 / 8.0 * (1.0 + _MAP_TOLERANCE):
                raise InvalidParameterError(f"OpenDP noisy-max calibration check failed (rho {rho!r})")  # pragma: no cover
            self._measurement = meas
        elif not isinstance(getattr(noise, "rng", None), np.random.Generator):
            raise InvalidParameterError(
                "noise must be a secure source (SecureNoise) or a seeded one with an .rng Generator"
            )

    @property
    def sampler(self) -> str:
        """What draws the output (recorded beside the release)."""
        if self._measurement is not None:
            return "OpenDP make_noisy_max (Gumbel report-noisy-max)"
        return "seeded numpy Gumbel-max (NOT for release)"

    def _effective(self, scores, epsilon, log_weights) -> np.ndarray:
        """The scores the mechanism at ``self.epsilon`` samples so that one draw is an
        ``epsilon``-DP exponential mechanism with base measure ``exp(log_weights)``:
        ``s (epsilon / self.epsilon) + (2 Delta / self.epsilon) log_weights``, then clamped.

        Scaling the scores by ``epsilon / self.epsilon <= 1`` scales their sensitivity to
        ``Delta epsilon / self.epsilon``; adding a public (data-independent) vector changes no
        sensitivity; the clamp is 1-Lipschitz. Output ``i`` then has probability proportional to
        ``w_i exp(epsilon s_i / (2 Delta))``."""
        eps = self.epsilon if epsilon is None else _check_positive(epsilon, "epsilon")
        if eps > self.epsilon * (1.0 + 1e-12):
            raise InvalidParameterError(f"a draw at epsilon {eps!r} exceeds the mechanism's {self.epsilon!r}")
        if log_weights is None and eps == self.epsilon:
            return clamp_scores(scores, self.integer_scores)
        if self.integer_scores:
            raise InvalidParameterError("epsilon and log_weights need float scores")
        s = clamp_scores(scores) * (min(eps, self.epsilon) / self.epsilon)
        if log_weights is not None:
            lw = np.asarray(log_weights, dtype=np.float64)
            if lw.shape != s.shape or not np.all(np.isfinite(lw)):
                raise InvalidParameterError("log_weights must be finite, one per candidate")
            s = s + (2.0 * self.sensitivity / self.epsilon) * lw
        return clamp_scores(s)

    def probabilities(self, scores, *, epsilon: float | None = None, log_weights=None) -> np.ndarray:
        """Exact output distribution ``softmax(epsilon s / (2 Delta) + log_weights)`` of the clamped
        scores, shape ``(n_candidates,)``, computed in log space (``epsilon``, ``log_weights``: as
        in :meth:`sample`)."""
        logits = _logits(self._effective(scores, epsilon, log_weights), self.epsilon, self.sensitivity)
        w = np.exp(logits)
        return w / w.sum()

    def sample(self, scores, *, epsilon: float | None = None, log_weights=None) -> int:
        """One draw: an index into ``scores`` (the largest score is the likeliest).

        ``scores`` (n_candidates,) pass through :func:`clamp_scores` (never refused for their
        values; only a wrongly typed or shaped array, fixed by the caller's code, is refused).

        ``epsilon`` (optional, at most the mechanism's): the draw's budget, for callers whose
        stage budget is chosen at run time from earlier DP outputs (the mechanism is built, and
        checked, before the reservation at the largest budget). ``log_weights`` (optional, public:
        never a function of the data beyond earlier DP outputs): a base measure, e.g. the log
        widths of candidate intervals, so that the draw is the exponential mechanism over a
        continuum with a piecewise-constant score (McSherry & Talwar 2007 allow any base
        measure). Either way the draw is ``epsilon``-DP for scores of sensitivity ``Delta``.
        """
        s = self._effective(scores, epsilon, log_weights)
        if self._measurement is not None:
            values = [int(v) for v in s] if self.integer_scores else [float(v) for v in s]
            return int(self._measurement(values))
        rng = self.noise.rng  # type: ignore[attr-defined]  # checked in __init__ for non-secure sources
        return int(np.argmax(_logits(s, self.epsilon, self.sensitivity) + rng.gumbel(size=s.size)))


def exponential_mechanism_probabilities(scores, epsilon: float, sensitivity: float = 1.0) -> np.ndarray:
    """Output distribution of the exponential mechanism: softmax of ``epsilon * S / (2 Delta)``.

    Computed in log space (max subtracted), so large scores never overflow; scores pass through
    :func:`clamp_scores` as in :meth:`ExponentialMechanism.sample`.

    Parameters
    ----------
    scores : ndarray of shape (n_candidates,)
    epsilon, sensitivity : float
        > 0.

    Returns
    -------
    ndarray of shape (n_candidates,), sums to 1.

    Raises
    ------
    InvalidParameterError
        Bad epsilon / sensitivity, or scores that are not a non-empty real vector.
    """
    eps = _check_positive(epsilon, "epsilon")
    delta_s = _check_positive(sensitivity, "sensitivity")
    logits = _logits(clamp_scores(scores, False), eps, delta_s)
    w = np.exp(logits)
    return w / w.sum()


def sample_exponential_mechanism(scores, epsilon: float, noise: NoiseSource, sensitivity: float = 1.0) -> int:
    """Draw an index with probability ``prop. exp(epsilon * S / (2 Delta))`` (Gumbel-max).

    One-shot form of :class:`ExponentialMechanism`: the integer path is used when the array's
    dtype is an integer type and ``Delta`` is an integer (both fixed by the caller's code, never
    by the score values). Callers that spend budget should build the mechanism first (before the
    charge) and call :meth:`ExponentialMechanism.sample` after it.

    Parameters
    ----------
    scores : ndarray of shape (n_candidates,)
    epsilon : float
    noise : NoiseSource
        ``SecureNoise`` for releases; ``SeededNoise`` in tests.
    sensitivity : float, default 1

    Returns
    -------
    int, index into ``scores``.

    Raises
    ------
    InvalidParameterError
        Bad parameters, a non-vector of scores, or a noise source that is neither secure nor
        seeded.

    Privacy
    -------
    epsilon-DP when every score has sensitivity ``Delta`` (McSherry-Talwar).
    """
    arr = np.asarray(scores)
    delta_s = _check_positive(sensitivity, "sensitivity")
    integer = bool(np.issubdtype(arr.dtype, np.integer) and delta_s == int(delta_s))
    return ExponentialMechanism(epsilon, noise, sensitivity=delta_s, integer_scores=integer).sample(arr)
