"""Person-level mean estimation (Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024)."""

from dplib.mean.api import person_level_mean, person_means
from dplib.mean.univariate import MeanRelease, UnivariateMeanPlan, univariate_person_mean

__all__ = ["MeanRelease", "UnivariateMeanPlan", "univariate_person_mean", "person_level_mean", "person_means"]
