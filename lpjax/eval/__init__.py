"""lpjax.eval: sample-quality metrics (FID) for the image models.

`lpjax.eval.fid` computes activation statistics and the Fréchet distance of any feature
extractor (a `feature_fn` hook); `lpjax.eval.inception` is the FID Inception-v3 (pool3, 2048-d)
that loads its weights from a user-given .npz file.

Examples:
  >>> import numpy as np
  >>> from lpjax.eval import fid
  >>> feats = np.random.default_rng(0).normal(size=(500, 4))
  >>> round(fid.frechet_distance(*fid.activation_statistics(feats), *fid.activation_statistics(feats)), 6)
  0.0
"""
