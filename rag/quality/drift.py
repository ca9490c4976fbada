"""Has what is asked moved away from what was asked before? A kernel two-sample test.

The statistic is the unbiased squared maximum mean discrepancy (MMD², Gretton et al. 2012)
between two sets of unit embeddings under an RBF kernel whose width is the median pairwise
distance of the pooled sets; its threshold is the (1 - alpha) quantile of the same statistic
over random relabellings of the pooled set (a permutation test, valid for any distribution).
The permutations are seeded by the caller (from the collection and the answers tested), so
every replica computes the same result from the same rows.

All permutations at once: with K the pooled kernel matrix (diagonal zeroed) and a_p the
0/1 indicator of the first set under permutation p, each statistic is a quadratic form in
a_p, so P permutations cost one [P, N] x [N, N] product.

Beside it, `scores_shift` compares two samples of top-passage scores (Kolmogorov-Smirnov)
and `rate` a refusal share: shown with the drift, not alerted on by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import ks_2samp

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Test:
    statistic: float  # MMD²
    threshold: float  # its (1 - alpha) permutation quantile
    p_value: float  # share of permutations at least as large (with the observed one)
    n_reference: int
    n_recent: int

    @property
    def score(self) -> float:
        """statistic / threshold: past 1 is past the threshold."""
        return self.statistic / self.threshold if self.threshold > 0 else 0.0

    @property
    def exceeded(self) -> bool:
        return self.statistic > self.threshold


def mmd_test(
    reference: F32, recent: F32, *, permutations: int = 200, alpha: float = 0.01, seed: int = 0
) -> Test:
    """Two-sample test of `reference` [m, d] against `recent` [n, d] (both m, n >= 2)."""
    x = np.asarray(reference, dtype=np.float64)
    y = np.asarray(recent, dtype=np.float64)
    m, n = len(x), len(y)
    if m < 2 or n < 2:
        raise ValueError("each sample needs at least two rows")
    z = np.vstack([x, y])
    sq = np.einsum("ij,ij->i", z, z)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)  # [N, N]
    off = d2[~np.eye(len(z), dtype=bool)]
    width = float(np.median(off)) if off.size else 1.0
    k = np.exp(-d2 / max(width, 1e-12))  # exp(-|a-b|² / median |a-b|²)
    np.fill_diagonal(k, 0.0)
    total = float(k.sum())

    def stats(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        # a: [P, N] indicators of the first set; b = 1 - a
        ak = a @ k  # [P, N]
        xx = np.einsum("pn,pn->p", ak, a)
        xy = ak.sum(axis=1) - xx  # a'K(1 - a)
        yy = total - 2.0 * xy - xx  # (1 - a)'K(1 - a)
        out: npt.NDArray[np.float64] = xx / (m * (m - 1)) + yy / (n * (n - 1)) - 2 * xy / (m * n)
        return out

    observed = np.zeros((1, m + n))
    observed[0, :m] = 1.0
    stat = float(stats(observed)[0])
    rng = np.random.default_rng(seed)
    perms = np.zeros((permutations, m + n))
    for p in range(permutations):
        perms[p, rng.permutation(m + n)[:m]] = 1.0
    null = stats(perms)
    threshold = float(np.quantile(null, 1.0 - alpha))
    p_value = (1 + int(np.sum(null >= stat))) / (permutations + 1)
    return Test(stat, threshold, p_value, m, n)


@dataclass(frozen=True)
class Shift:
    ks: float  # the Kolmogorov-Smirnov distance of the two samples
    p_value: float
    reference_mean: float
    recent_mean: float


def scores_shift(reference: list[float], recent: list[float]) -> Shift | None:
    """How the top passage's score moved (None without two scores on each side)."""
    if len(reference) < 2 or len(recent) < 2:
        return None
    result = ks_2samp(reference, recent)
    return Shift(
        float(result.statistic),
        float(result.pvalue),
        float(np.mean(reference)),
        float(np.mean(recent)),
    )


def rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None
