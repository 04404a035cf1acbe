"""lpjax.eval: sample-quality metrics (FID) for the image models.

`fid` computes the Fréchet distance between two image sets through any feature extractor (a
`feature_fn` hook); `inception_feature_fn(path)` is the FID Inception-v3 (pool3, 2048-d), whose
weights load from a user-given .npz file (`load_inception`, `save_weights`).

Examples:
  >>> import numpy as np
  >>> from lpjax import eval as lpeval
  >>> feats = np.random.default_rng(0).normal(size=(500, 4))
  >>> stats = lpeval.activation_statistics(feats)
  >>> round(lpeval.frechet_distance(*stats, *stats), 6)
  0.0
"""

from lpjax.eval._fid import activation_statistics, fid, frechet_distance, statistics_of
from lpjax.eval._inception import (
    InceptionV3,
    inception_feature_fn,
    load_inception,
    save_weights,
)

__all__ = ["InceptionV3", "activation_statistics", "fid", "frechet_distance",
           "inception_feature_fn", "load_inception", "save_weights", "statistics_of"]
