"""Sequential Temperature Scaling (SPEC section 5) and calibration metrics.

c_hat_k = sigmoid(z_k / T_k). T_1 is fitted first on held-out data, then T_2 with T_1 fixed, and so on, each
by a 1-D grid search minimising the ECE of the prefix survivals prod_{i<=j} c_hat_i against the labels
"drafts 0..j all accepted", pooled over positions j <= k: the last step's objective is the ECE we report.
Minimising each position's own ECE instead let a few deep-position blocks pick extreme temperatures that made
the pooled ECE worse; and if the fit still loses to T = 1 on the pooled ECE, T = 1 is kept. The JSON is
SGLang's: {temperatures, num_samples, ece_before, ece_after} plus AUROC and Brier before/after.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from .io_utils import write_json_atomic

GRID = torch.logspace(-1, 1, 41)  # 41 log-spaced temperatures in [0.1, 10]


def prefix_survival(conf_logits: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    """conf_logits [M, B] -> prefix survival a_k = prod_{i<=k} sigmoid(z_i / T_i), [M, B]."""
    z = conf_logits.float()
    if temperatures is not None:
        z = z / temperatures.to(z)
    return torch.sigmoid(z).cumprod(dim=-1)


def prefix_labels(num_accepted: torch.Tensor, block_size: int) -> torch.Tensor:
    """num_accepted [M] -> labels [M, B]: 1 where drafts 0..k were all accepted."""
    return (torch.arange(block_size)[None, :] < num_accepted[:, None]).float()


def ece(pred: torch.Tensor, label: torch.Tensor, bins: int = 15) -> float:
    """Expected calibration error with equal-width bins over flattened predictions and 0/1 labels."""
    pred, label = pred.flatten().float(), label.flatten().float()
    if pred.numel() == 0:
        return float("nan")
    idx = (pred * bins).long().clamp(0, bins - 1)
    total = torch.zeros(bins).index_add_(0, idx, torch.ones_like(pred))
    conf = torch.zeros(bins).index_add_(0, idx, pred)
    acc = torch.zeros(bins).index_add_(0, idx, label)
    return float(((conf - acc).abs()).sum() / pred.numel())


def auroc(pred: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve by ranks (ties averaged)."""
    pred, label = pred.flatten().double(), label.flatten().double()
    pos, neg = label.sum(), (1 - label).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    order = pred.argsort()
    ranks = torch.empty_like(pred)
    ranks[order] = torch.arange(1, pred.numel() + 1, dtype=torch.double)
    # average ranks of ties
    uniq, inverse = torch.unique(pred, return_inverse=True)
    if uniq.numel() < pred.numel():
        sums = torch.zeros(uniq.numel(), dtype=torch.double).index_add_(0, inverse, ranks)
        counts = torch.zeros(uniq.numel(), dtype=torch.double).index_add_(0, inverse, torch.ones_like(ranks))
        ranks = (sums / counts)[inverse]
    return float((ranks[label == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def brier(pred: torch.Tensor, label: torch.Tensor) -> float:
    return float(((pred.float() - label.float()) ** 2).mean())


def _metrics(pred: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    p, y = pred[mask], label[mask]
    return {"ece": ece(p, y), "auroc": auroc(p, y), "brier": brier(p, y)}


def fit_sts(
    conf_logits: torch.Tensor,  # [M, B] confidence logits of drafted blocks
    num_accepted: torch.Tensor,  # [M] accepted drafts per block
    num_verified: torch.Tensor | None = None,  # [M] verified drafts per block (labels beyond are unknown)
) -> dict:
    """Fit one temperature per position sequentially; returns the calibration dict (SGLang schema + metrics)."""
    m, b = conf_logits.shape
    if m == 0:
        raise ValueError("No calibration samples were collected; run calibration on at least one prompt.")
    labels = prefix_labels(num_accepted, b)
    verified = torch.full((m,), b) if num_verified is None else num_verified
    mask = torch.arange(b)[None, :] < verified[:, None]
    temps = torch.ones(b)
    for k in range(b):
        if not mask[:, k].any():
            continue
        seen = mask[:, : k + 1]  # [M, k+1] positions fitted so far
        best, best_t = math.inf, 1.0
        for t in [1.0, *GRID.tolist()]:  # T = 1 first: it wins ties
            temps[k] = t
            score = ece(prefix_survival(conf_logits[:, : k + 1], temps[: k + 1])[seen], labels[:, : k + 1][seen])
            if score < best - 1e-12:
                best, best_t = score, t
        temps[k] = best_t
    before = _metrics(prefix_survival(conf_logits), labels, mask)
    after = _metrics(prefix_survival(conf_logits, temps), labels, mask)
    if after["ece"] > before["ece"]:
        temps, after = torch.ones(b), before
    return {
        "temperatures": [float(t) for t in temps],
        "num_samples": int(m),
        "block_size": int(b),
        "ece_before": before["ece"],
        "ece_after": after["ece"],
        "auroc_before": before["auroc"],
        "auroc_after": after["auroc"],
        "brier_before": before["brier"],
        "brier_after": after["brier"],
    }


def save_calibration(calibration: dict, path: str | os.PathLike) -> None:
    write_json_atomic(path, calibration)


def load_calibration(path: str | os.PathLike, block_size: int | None = None) -> dict:
    """Read calibration.json; a malformed file or one for another block size gives a clear error."""
    try:
        data = json.loads(Path(path).read_text())
        temps = [float(t) for t in data["temperatures"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a valid calibration file ({err}); re-run `hf-dspark calibrate`.") from err
    if block_size is not None and len(temps) != block_size:
        raise ValueError(
            f"{path} has {len(temps)} temperatures but the drafter's block_size is {block_size}; re-run `hf-dspark calibrate`."
        )
    if not all(math.isfinite(t) and t > 0 for t in temps):
        raise ValueError(f"{path} has non-positive or non-finite temperatures; re-run `hf-dspark calibrate`.")
    data["temperatures"] = temps
    return data


def plot_reliability(
    conf_logits: torch.Tensor,
    num_accepted: torch.Tensor,
    calibration: dict,
    path: str | os.PathLike,
    bins: int = 15,
    num_verified: torch.Tensor | None = None,
) -> None:
    """Reliability diagram (prefix survival vs observed prefix acceptance) before and after STS, as a PNG.

    Only verified positions have labels; pass `num_verified` ([M]) to leave the others out (as `fit_sts` does).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, b = conf_logits.shape
    labels = prefix_labels(num_accepted, b)
    verified = torch.full((m,), b) if num_verified is None else num_verified
    mask = torch.arange(b)[None, :] < verified[:, None]
    temps = torch.tensor(calibration["temperatures"])
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect")
    for name, pred in (("before", prefix_survival(conf_logits)), ("after STS", prefix_survival(conf_logits, temps))):
        p, y = pred[mask], labels[mask]
        idx = (p * bins).long().clamp(0, bins - 1)
        xs, ys = [], []
        for i in range(bins):
            sel = idx == i
            if sel.any():
                xs.append(float(p[sel].mean()))
                ys.append(float(y[sel].mean()))
        ax.plot(xs, ys, "o-", label=f"{name} (ECE {ece(p, y):.3f})")
    ax.set_xlabel("predicted prefix survival")
    ax.set_ylabel("observed prefix acceptance")
    ax.set_title("DSpark confidence calibration")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
