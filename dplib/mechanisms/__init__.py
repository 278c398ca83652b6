"""Mechanisms: noise sources, Laplace / Gaussian / exponential mechanisms, private histograms."""

from dplib.mechanisms.basic import (
    EXACT_BOUND,
    clamp_exact,
    inflate,
    analytic_gaussian_delta,
    gaussian_mechanism,
    gaussian_sigma,
    laplace_mechanism,
    laplace_scale,
)
from dplib.mechanisms.exponential import (
    ExponentialMechanism,
    clamp_scores,
    exponential_mechanism_probabilities,
    sample_exponential_mechanism,
)
from dplib.mechanisms.histograms import pure_dp_histogram, stability_threshold, thresholded_histogram
from dplib.mechanisms.noise import NoiseSource, SecureNoise, SeededNoise, production_noise

__all__ = [
    "NoiseSource",
    "SecureNoise",
    "SeededNoise",
    "production_noise",
    "laplace_mechanism",
    "clamp_exact",
    "inflate",
    "EXACT_BOUND",
    "laplace_scale",
    "gaussian_mechanism",
    "gaussian_sigma",
    "analytic_gaussian_delta",
    "pure_dp_histogram",
    "stability_threshold",
    "thresholded_histogram",
    "ExponentialMechanism",
    "clamp_scores",
    "exponential_mechanism_probabilities",
    "sample_exponential_mechanism",
]
