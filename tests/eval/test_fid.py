"""lpjax.eval._fid: the Fréchet distance against float64 closed forms and independent references."""

import numpy as np
import pytest

from lpjax.eval._fid import activation_statistics, fid, frechet_distance, sqrtm_psd, statistics_of


def random_spd(d, rng, rank=None):
  a = rng.normal(size=(d, rank or 2 * d))
  return a @ a.T / (rank or 2 * d)


def test_diagonal_covariances_match_the_closed_form():
  rng = np.random.default_rng(0)
  mu1, mu2 = rng.normal(size=16), rng.normal(size=16)
  s1, s2 = rng.uniform(0.1, 3.0, 16), rng.uniform(0.1, 3.0, 16)
  want = np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2 * np.sqrt(s1 * s2))
  assert frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2)) == pytest.approx(want, rel=1e-10)


def test_general_covariances_match_the_eigenvalues_of_the_product():
  # tr((S1 S2)^(1/2)) = sum sqrt(eig(S1 S2)): an independent route (non-symmetric eig of the product).
  rng = np.random.default_rng(1)
  mu1, mu2 = rng.normal(size=12), rng.normal(size=12)
  s1, s2 = random_spd(12, rng), random_spd(12, rng)
  eig = np.linalg.eigvals(s1 @ s2)
  want = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.sum(np.sqrt(eig.real))
  got = frechet_distance(mu1, s1, mu2, s2)
  assert got == pytest.approx(want, rel=1e-9)
  assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(got, rel=1e-9)  # symmetric
  linalg = pytest.importorskip("scipy.linalg")
  ref = np.sum((mu1 - mu2) ** 2) + np.trace(s1 + s2 - 2 * linalg.sqrtm(s1 @ s2).real)
  assert got == pytest.approx(ref, rel=1e-8)


def test_identical_and_singular_statistics():
  rng = np.random.default_rng(2)
  feats = rng.normal(size=(5, 10))  # n < d: singular covariance, as with few samples in FID
  mu, sigma = activation_statistics(feats)
  assert frechet_distance(mu, sigma, mu, sigma) == pytest.approx(0.0, abs=1e-9)
  other = activation_statistics(rng.normal(size=(5, 10)))
  assert np.isfinite(frechet_distance(mu, sigma, *other)) and frechet_distance(mu, sigma, *other) > 0


def test_sqrtm_psd_squares_back():
  s = random_spd(8, np.random.default_rng(3))
  root = sqrtm_psd(s)
  np.testing.assert_allclose(root @ root, s, atol=1e-12)
  np.testing.assert_allclose(root, root.T, atol=1e-14)


def test_statistics_and_sample_based_distance():
  rng = np.random.default_rng(4)
  a = rng.normal(size=(20000, 3))
  mu, sigma = activation_statistics(a)
  np.testing.assert_allclose(mu, a.mean(0))
  np.testing.assert_allclose(sigma, np.cov(a.T))
  b = rng.normal(size=(20000, 3)) * 2.0 + np.array([1.0, 0.0, -1.0])
  # N(0, I) vs N(m, 4I): ||m||^2 + 3 (1 + 4 - 2 * 2) = 2 + 3 = 5, up to sampling error.
  assert frechet_distance(mu, sigma, *activation_statistics(b)) == pytest.approx(5.0, abs=0.1)


def test_feature_fn_hook_batches_like_one_shot():
  rng = np.random.default_rng(5)
  x, y = rng.normal(size=(103, 2, 2, 1)), rng.normal(size=(90, 2, 2, 1)) + 0.5
  feature_fn = lambda images: np.tanh(images.reshape(len(images), -1))
  mu, sigma = statistics_of(x, feature_fn, batch_size=10)
  mu1, sigma1 = activation_statistics(feature_fn(x))
  np.testing.assert_allclose(mu, mu1, rtol=1e-12)
  np.testing.assert_allclose(sigma, sigma1, rtol=1e-12)
  batches = [x[:50], x[50:]]
  np.testing.assert_allclose(statistics_of(iter(batches), feature_fn)[1], sigma1, rtol=1e-12)
  want = frechet_distance(mu1, sigma1, *activation_statistics(feature_fn(y)))
  assert fid(x, y, feature_fn, batch_size=7) == pytest.approx(want, rel=1e-12)


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match="Shapes do not match"):
    frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
  with pytest.raises(ValueError, match=r"features must be \(n >= 2, d\)"):
    activation_statistics(np.zeros((1, 3)))
