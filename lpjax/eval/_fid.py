"""Fréchet Inception Distance: activation statistics and the Fréchet distance of two Gaussians.

    FID = ||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2))            (Heusel et al. 2017)

computed in float64 numpy. tr((S1 S2)^(1/2)) is evaluated as tr((S1^(1/2) S2 S1^(1/2))^(1/2)): the
same eigenvalues (S1 S2 is similar to that symmetric PSD matrix), but symmetric, so `numpy.linalg.eigh`
gives it stably without scipy and without the complex round-off `scipy.linalg.sqrtm` returns on
near-singular products. Features come from any `feature_fn(images) -> (b, d)`; the standard one is
`lpjax.eval.inception_feature_fn(npz_path)` (pool3 of the FID Inception-v3, d = 2048).
Published FIDs use 50k samples and the TF-FID Inception weights; with fewer samples FID is biased
upwards, so compare numbers computed on the same number of samples only.

Examples:
  >>> import numpy as np
  >>> rng = np.random.default_rng(0)
  >>> a, b = rng.normal(size=(4000, 3)), rng.normal(loc=1.0, size=(4000, 3))
  >>> mu1, s1 = activation_statistics(a)
  >>> mu2, s2 = activation_statistics(b)
  >>> round(frechet_distance(mu1, s1, mu2, s2), 1)   # ~ ||(1, 1, 1)||^2 = 3
  3.0
  >>> feature_fn = lambda images: images.reshape(len(images), -1)   # a stand-in extractor
  >>> round(fid(rng.normal(size=(64, 2, 2, 1)), rng.normal(size=(64, 2, 2, 1)), feature_fn), 1) >= 0
  True
"""

from __future__ import annotations

from typing import Callable

import numpy as np

FeatureFn = Callable[[np.ndarray], np.ndarray]


def activation_statistics(features) -> tuple[np.ndarray, np.ndarray]:
  """(mean (d,), covariance (d, d)) of features (n, d), float64, unbiased covariance (n - 1)."""
  features = np.asarray(features, np.float64)
  if features.ndim != 2 or features.shape[0] < 2:
    raise ValueError(f"features must be (n >= 2, d), got shape {features.shape}.")
  return features.mean(axis=0), np.cov(features, rowvar=False).reshape(features.shape[1], -1)


def sqrtm_psd(matrix) -> np.ndarray:
  """The symmetric PSD square root of a symmetric matrix (negative round-off eigenvalues -> 0)."""
  matrix = np.asarray(matrix, np.float64)
  w, v = np.linalg.eigh((matrix + matrix.T) / 2)
  return (v * np.sqrt(np.maximum(w, 0.0))) @ v.T


def trace_sqrt_product(sigma1, sigma2) -> float:
  """tr((S1 S2)^(1/2)) for PSD S1, S2, as tr((S1^(1/2) S2 S1^(1/2))^(1/2))."""
  root1 = sqrtm_psd(sigma1)
  inner = root1 @ np.asarray(sigma2, np.float64) @ root1
  w = np.linalg.eigvalsh((inner + inner.T) / 2)
  return float(np.sum(np.sqrt(np.maximum(w, 0.0))))


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
  """Squared Fréchet (2-Wasserstein) distance between N(mu1, sigma1) and N(mu2, sigma2), >= 0."""
  mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
  sigma1 = np.atleast_2d(np.asarray(sigma1, np.float64))
  sigma2 = np.atleast_2d(np.asarray(sigma2, np.float64))
  d = mu1.shape[0]
  if mu1.shape != (d,) or mu2.shape != (d,) or sigma1.shape != (d, d) or sigma2.shape != (d, d):
    raise ValueError(f"Shapes do not match: mu1 {mu1.shape}, sigma1 {sigma1.shape}, mu2 {mu2.shape}, "
                     f"sigma2 {sigma2.shape}; expected (d,) means and (d, d) covariances.")
  diff = mu1 - mu2
  distance = diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * trace_sqrt_product(sigma1, sigma2)
  return max(float(distance), 0.0)  # round-off can make identical statistics give -1e-12


def statistics_of(images, feature_fn: FeatureFn, batch_size: int = 250):
  """Activation statistics of feature_fn over `images` (an array, batched here) or an iterable of
  image batches."""
  if isinstance(images, np.ndarray) or hasattr(images, "shape"):
    images = np.asarray(images)
    batches = (images[i:i + batch_size] for i in range(0, len(images), batch_size))
  else:
    batches = images
  features = [np.asarray(feature_fn(batch), np.float64) for batch in batches]
  return activation_statistics(np.concatenate(features, axis=0))


def fid(images1, images2, feature_fn: FeatureFn, batch_size: int = 250) -> float:
  """FID between two image sets under `feature_fn` (e.g. samples vs the test split)."""
  return frechet_distance(*statistics_of(images1, feature_fn, batch_size),
                          *statistics_of(images2, feature_fn, batch_size))
