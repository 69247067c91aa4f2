"""Reproduce the paper's SMILES LSTM study (§2.4: Fig. 9 to 12, Table 1) at a scale this CPU can carry.

Steps:

1. Load the trained REINVENT-style LSTM (``benchmarks/models/smiles_lstm.pt`` and its vocabulary JSON)
   and the training part of the ChEMBL corpus (the split of ``_smiles_lstm.py``).
2. Time one GGN product and one generation block. Log the projected cost of the run before it starts.
3. Subsampling study (Fig. 9). For each N_sub in ``--sizes``, R = ``--replicas`` independent subsamples
   get the top d_max = 3 GGN eigenpairs with l = 13 Lanczos steps (as in the paper). The study reports
   |⟨p1^(i), p1^(j)⟩| and |⟨p1, p1_ref⟩| against a reference run on ``--reference-size`` sequences. The
   first replica at N_sub = ``--n-sub`` (2000) is the curvature used in everything that follows.
4. Posteriors from those eigenpairs. Standard scaling uses β = N, the number of tokens of the
   subsample. Mean scaling uses β = 1. σ0 comes from empirical Bayes at each d.
5. Generation (Table 1, Fig. 10, 11). ``--n-generate`` SMILES (max length 256) are drawn for the
   baseline θ0 and for both scalings at d = 1, 2, 3. Each block of ``--block-size`` molecules uses a
   fresh weight sample θ0 + P z. All configurations share their random numbers: the same standard
   normals for z, and, block by block, the same softmax sampling stream. Differences between
   configurations therefore come from the weights alone.
6. RDKit validity, molecular weight, SA score and SlogP of the valid molecules, the share with
   SlogP > 5, and the cumulative activity curve at d = 2 (Fig. 12).

Usage::

    python benchmarks/paper_smiles.py --quick            # minutes: smoke test, writes paper_smiles_quick*
    nohup python benchmarks/paper_smiles.py > /tmp/paper_smiles.log 2>&1 &
    python benchmarks/paper_smiles.py --report-only      # the report and figures again from the results files

Outputs under ``benchmarks/results/`` (or ``--out-dir``): ``paper_smiles.json``, ``paper_smiles_alignment.csv``
(one row per eigen run), ``paper_smiles_generated.csv.gz`` (every generated SMILES with its properties), the
report ``paper_smiles.md`` rendered from the JSON and the alignment CSV, and ``paper_smiles_fig{9,10,11,12}_*.png``
drawn from the CSVs.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings

import _common
import numpy as np
import pandas as pd
import torch
from _smiles_lstm import CORPUS, MODEL_PATH, VOCAB_PATH, generate, load_model, split_corpus

from glas_sklearn.contrib.smiles import encode_batch, load_smiles
from glas_sklearn.diagnostics import subsample_alignment
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.likelihoods import Categorical
from glas_sklearn.posterior import ActiveSubspacePosterior
from glas_sklearn.sampling import sample_parameters

logger = logging.getLogger("paper_smiles")

# The paper's Table 1 (valid SMILES out of 10k).
PAPER_TABLE1 = {"baseline": 8692, ("standard", 1): 8709, ("standard", 2): 8753, ("standard", 3): 8732,
                ("mean", 1): 6863, ("mean", 2): 5279, ("mean", 3): 4435}


class Clock:
    """Wall and CPU seconds of a stage."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="tiny sizes for a smoke test")
    p.add_argument("--n-generate", type=int, default=None, help="SMILES per configuration (default 10000; quick 200)")
    p.add_argument("--block-size", type=int, default=None, help="molecules per weight sample (default 100; quick 50)")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="N_sub values of the subsampling study "
                   "(default 250 500 1000 2000)")
    p.add_argument("--replicas", type=int, default=None,
                   help="independent subsamples per N_sub (default 2; 3 adds about 20 min CPU)")
    p.add_argument("--reference-size", type=int, default=None, help="sequences of the reference run (default 3000)")
    p.add_argument("--n-sub", type=int, default=None,
                   help="N_sub of the curvature used for the posteriors (default 2000)")
    p.add_argument("--d-max", type=int, default=3)
    p.add_argument("--lanczos-steps", type=int, default=13, help="l, Lanczos steps per eigen run (paper: 13)")
    p.add_argument("--ggn-batch", type=int, default=100, help="sequences per GGN mini-batch")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe-only", action="store_true", help="time one GGN product and one generation block, "
                   "log the projected cost of the run with these options, and stop")
    p.add_argument("--model", default=MODEL_PATH)
    p.add_argument("--vocab", default=VOCAB_PATH)
    args = p.parse_args(argv)
    full = dict(n_generate=10000, block_size=100, sizes=[250, 500, 1000, 2000], replicas=2, reference_size=3000,
                n_sub=2000)
    quick = dict(n_generate=200, block_size=50, sizes=[20, 40], replicas=2, reference_size=60, n_sub=40)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.n_sub not in args.sizes:
        args.sizes = sorted(args.sizes + [args.n_sub])
    args.out = str(args.out_dir / ("paper_smiles_quick" if args.quick else "paper_smiles"))  # prefix of all outputs
    return args


# ------------------------------------------------------------------------------------------ stages


def load_training_data(vocab):
    corpus = load_smiles(CORPUS)
    train, _ = split_corpus(corpus, 0.05, 0)  # the split _smiles_lstm.py trained on
    tokens, mask = encode_batch(train, vocab)
    return train, tokens[:, :-1].contiguous(), mask


def timing_probe(model, vocab, train, args) -> dict:
    """CPU seconds of one GGN product per sequence and of generating one molecule at θ0.

    The GGN is timed as the study computes it: 2 mini-batches of ``--ggn-batch`` length-sorted sequences,
    each padded only to its own longest sequence, after one warm-up product.
    """
    rng = np.random.default_rng(args.seed + 99)
    n = 2 * args.ggn_batch
    rows = sorted((train[i] for i in rng.choice(len(train), n, replace=False)), key=len)
    ops = []
    for i in range(0, n, args.ggn_batch):
        tokens, mask = encode_batch(rows[i:i + args.ggn_batch], vocab)
        ops.append(GGNOperator(model, tokens[:, :-1], loss="cross_entropy", mask=mask, reuse_linearization=False))
    v = torch.randn(ops[0].shape[0], generator=torch.Generator().manual_seed(0))
    for op in ops:
        op @ v  # warm-up
    clock = Clock()
    for op in ops:
        op @ v
    ggn = clock.read()
    clock = Clock()
    generate(model, vocab, args.block_size, max_len=args.max_len, batch_size=args.block_size,
             generator=torch.Generator().manual_seed(args.seed + 98))
    gen = clock.read()
    out = {"ggn_cpu_s_per_sequence_product": ggn["cpu_s"] / n,
           "ggn_wall_s_per_sequence_product": ggn["wall_s"] / n,
           "gen_cpu_s_per_molecule": gen["cpu_s"] / args.block_size,
           "gen_wall_s_per_molecule": gen["wall_s"] / args.block_size}
    seq_products = args.lanczos_steps * (args.replicas * sum(args.sizes) + args.reference_size)
    out["projected_eigen_cpu_min"] = seq_products * out["ggn_cpu_s_per_sequence_product"] / 60
    out["projected_generation_cpu_min"] = 7 * args.n_generate * out["gen_cpu_s_per_molecule"] / 60
    logger.info("timing probe: one GGN product %.1f ms CPU per sequence (%.1f ms wall); generation %.1f ms CPU "
                "per molecule (%.1f ms wall)", 1e3 * out["ggn_cpu_s_per_sequence_product"],
                1e3 * out["ggn_wall_s_per_sequence_product"], 1e3 * out["gen_cpu_s_per_molecule"],
                1e3 * out["gen_wall_s_per_molecule"])
    logger.info("projected CPU time: eigen runs %.0f min (%d sequence-products), generation %.0f min "
                "(7 x %d molecules), plus RDKit", out["projected_eigen_cpu_min"], seq_products,
                out["projected_generation_cpu_min"], args.n_generate)
    return out


def subsampling_study(model, X, mask, args):
    clock = Clock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = subsample_alignment(model, X, mask=mask, subsample_sizes=args.sizes, n_replicas=args.replicas,
                                  reference_size=args.reference_size, n_components=args.d_max,
                                  max_matvecs=args.lanczos_steps, ncv=args.lanczos_steps,
                                  batch_size=args.ggn_batch, trim_padding=True, reuse_linearization=False,
                                  return_eigen=True, random_state=args.seed)
    n_warn = sum("did not converge" in str(w.message) for w in caught)
    logger.info("subsampling study done (%.1f min CPU, %.1f min wall); %d of %d runs flagged as not converged "
                "to tol 1e-5 after %d Lanczos steps (residuals in the table)", clock.read()["cpu_s"] / 60,
                clock.read()["wall_s"] / 60, n_warn, len(res["table"]), args.lanczos_steps)
    return res, clock.read()


def build_posteriors(model, eig, n_records, d_max):
    posts = {}
    for scaling in ("standard", "mean"):
        beta = Categorical().beta(scaling, n_records)
        posts[scaling] = ActiveSubspacePosterior(model, eig.eigenvalues, eig.eigenvectors, beta=beta)
    rows = []
    for scaling, post in posts.items():
        for d in range(1, d_max + 1):
            rows.append({"scaling": scaling, "beta": post.beta, "d": d, "sigma0": post.fit_sigma0(d),
                         "sigma_j": [float(s) for s in post.variances(d).double().sqrt()],
                         "contraction": [float(c) for c in post.contraction(d).double()],
                         "perturbation_norm_rms": float(post.variances(d).double().sum().sqrt())})
    return posts, rows


def generate_configs(model, vocab, posts, args):
    from glas_sklearn.contrib.chem import describe  # needs RDKit (the chem extra)

    configs = [("baseline", 0)] + [(s, d) for s in ("standard", "mean") for d in range(1, args.d_max + 1)]
    n_blocks = math.ceil(args.n_generate / args.block_size)
    frames, timings = [], {}
    for scaling, d in configs:
        clock = Clock()
        if scaling == "baseline":
            weight_samples = [None] * n_blocks
        else:  # the same standard normals for every (scaling, d): common random numbers
            weight_samples = sample_parameters(posts[scaling], d, n_blocks, random_state=args.seed + 1)
        smiles, lengths, blocks = [], [], []
        for b, params in enumerate(weight_samples):
            n = min(args.block_size, args.n_generate - b * args.block_size)
            # Block b samples its tokens from the same stream in every configuration.
            gen = torch.Generator().manual_seed(1_000_003 * (args.seed + 2) + b)
            s, L = generate(model, vocab, n, params=params, max_len=args.max_len, batch_size=n, generator=gen,
                            return_lengths=True)
            smiles += s
            lengths += L
            blocks += [b] * n
        gen_time = clock.read()
        props = describe(smiles, sa=True)
        props.insert(0, "config", scaling if scaling == "baseline" else f"{scaling} d={d}")
        props.insert(1, "scaling", scaling)
        props.insert(2, "d", d)
        props.insert(3, "block", blocks)
        props["length"] = lengths
        frames.append(props)
        total = clock.read()
        timings[props["config"].iloc[0]] = {"generation": gen_time, "total": total}
        logger.info("%-12s: %d/%d valid, mean length %.1f, %.1f min CPU (%.1f min wall)", props["config"].iloc[0],
                    int(props["valid"].sum()), len(props), float(np.mean(lengths)), total["cpu_s"] / 60,
                    total["wall_s"] / 60)
    return pd.concat(frames, ignore_index=True), timings


# ----------------------------------------------------------------------------------------- summary


def summarize(df, max_len):
    base = df[df.config == "baseline"]["smiles"].to_numpy()
    rows = []
    for config, g in df.groupby("config", sort=False):
        v = g[g.valid]
        same = float(np.mean(g.smiles.to_numpy() == base)) if len(g) == len(base) else math.nan
        row = {"config": config, "scaling": g.scaling.iloc[0], "d": int(g.d.iloc[0]), "n": len(g),
               "valid": int(g.valid.sum()), "valid_share": float(g.valid.mean()),
               "unique_valid": int(v.canonical.nunique()),
               "identical_to_baseline": same,
               "length_mean": float(g.length.mean()), "length_median": float(g.length.median()),
               "length_p95": float(g.length.quantile(0.95)), "at_max_len": int((g.length >= max_len).sum()),
               "valid_length_mean": float(v.length.mean()) if len(v) else math.nan}
        for col in ("mol_wt", "sa_score", "slogp"):
            row[f"{col}_mean"] = float(v[col].mean()) if len(v) else math.nan
            row[f"{col}_std"] = float(v[col].std()) if len(v) > 1 else math.nan
            row[f"{col}_p05"] = float(v[col].quantile(0.05)) if len(v) else math.nan
            row[f"{col}_p95"] = float(v[col].quantile(0.95)) if len(v) else math.nan
        row["slogp_gt5_share"] = float((v.slogp > 5).mean()) if len(v) else math.nan
        # Valid molecules of 100+ tokens (long chains such as C...C that a perturbed model can emit and that
        # RDKit accepts), and the spread of the valid share between weight samples (blocks).
        row["valid_len_ge100"] = int((g.valid & (g.length >= 100)).sum())
        blocks = g.groupby("block").valid.mean()
        row["block_valid_median"] = float(blocks.median())
        row["block_valid_p10"] = float(blocks.quantile(0.1))
        row["block_valid_p90"] = float(blocks.quantile(0.9))
        row["valid_share_se"] = float(blocks.std(ddof=1) / math.sqrt(len(blocks))) if len(blocks) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def activity_summary(post, d):
    kappa = post.cumulative_activity(d).double().cpu().numpy()
    D = len(kappa)
    out = {"d": d, "n_weights": D}
    for level in (0.5, 0.9, 0.95, 0.99):
        k = int(np.searchsorted(kappa, level) + 1)
        out[f"weights_for_{int(level * 100)}pct"] = k
        out[f"share_for_{int(level * 100)}pct"] = k / D
    return kappa, out


# ---------------------------------------------------------------------------------------- figures


def _kde(ax, values, grid, **kw):
    """Gaussian KDE with Silverman's robust bandwidth (min of std and IQR/1.349), so that a heavy tail
    (e.g. the very long molecules of mean scaling at d = 3) does not flatten the whole curve."""
    from scipy.stats import gaussian_kde

    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < 5 or np.ptp(values) == 0:
        return
    std = values.std(ddof=1)
    q75, q25 = np.percentile(values, [75, 25])
    spread = min(std, (q75 - q25) / 1.349) or std
    h = 0.9 * spread * len(values) ** -0.2
    ax.plot(grid, gaussian_kde(values, bw_method=h / std)(grid), **kw)


_COLORS = {1: "tab:blue", 2: "tab:orange", 3: "tab:red"}


def _size_axis(ax, sizes):
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())


def fig9(res, args, path):
    plt = _common.pyplot()

    table = res["table"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    rng = np.random.default_rng(0)
    for size in args.sizes:
        a = res["reference_alignment"][size]
        ax.scatter(np.full(len(a), size) * (1 + 0.03 * rng.standard_normal(len(a))), a, color="tab:blue",
                   label="|<p1, p1_ref>| (replicas)" if size == args.sizes[0] else None)
        A = res["replica_alignment"][size]
        off = A[~np.eye(len(A), dtype=bool)]
        if off.size:
            ax.scatter([size], [off.min()], marker="x", color="tab:red",
                       label="min |<p1_i, p1_j>| (replica matrix)" if size == args.sizes[0] else None)
    _size_axis(ax, args.sizes)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("N_sub (SMILES)")
    ax.set_ylabel("alignment")
    ax.set_title(f"Fig. 9: p1 vs reference (N_sub = {args.reference_size}), {args.replicas} replicas")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[1]
    rep = table[table.run == "replica"]
    for j in range(1, args.d_max + 1):
        ax.scatter(rep.subsample_size, rep[f"lambda_{j}"], color=_COLORS.get(j, "k"), label=f"lambda_{j}", s=14)
        ref = table[table.run == "reference"]
        if len(ref):
            ax.axhline(float(ref[f"lambda_{j}"].iloc[0]), color=_COLORS.get(j, "k"), ls=":", lw=1)
    _size_axis(ax, args.sizes)
    ax.set_yscale("log")
    ax.set_xlabel("N_sub (SMILES)")
    ax.set_ylabel("GGN eigenvalue (dotted: reference)")
    ax.set_title(f"leading eigenvalues, l = {args.lanczos_steps} Lanczos steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig10(df, args, path):
    plt = _common.pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    grid = np.linspace(0, args.max_len + 10, 400)
    base = df[df.config == "baseline"]
    for ax, scaling in zip(axes, ("standard", "mean"), strict=True):
        _kde(ax, base.length, grid, color="k", ls="--", label="baseline")
        for d in range(1, args.d_max + 1):
            g = df[(df.scaling == scaling) & (df.d == d)]
            _kde(ax, g.length, grid, color=_COLORS.get(d), label=f"d = {d}")
        ax.axvline(args.max_len, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylim(1e-5, 0.1)
        ax.set_xlabel("tokens per generated SMILES (all sequences)")
        ax.set_title(f"Fig. 10: {scaling} scaling")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("density (KDE, log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig11(df, args, path):
    plt = _common.pyplot()

    qois = [("mol_wt", "molecular weight", (0, 900)), ("sa_score", "SA score", (1, 10)), ("slogp", "SlogP", (-6, 12))]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    valid = df[df.valid]
    base = valid[valid.config == "baseline"]
    for i, scaling in enumerate(("standard", "mean")):
        for j, (col, label, (lo, hi)) in enumerate(qois):
            ax = axes[i, j]
            grid = np.linspace(lo, hi, 400)
            _kde(ax, base[col], grid, color="k", ls="--", label="baseline")
            for d in range(1, args.d_max + 1):
                g = valid[(valid.scaling == scaling) & (valid.d == d)]
                _kde(ax, g[col], grid, color=_COLORS.get(d), label=f"d = {d} ({len(g)} valid)")
            if col == "slogp":
                ax.axvline(5, color="grey", lw=0.8)
            ax.set_xlabel(label)
            ax.set_title(f"{scaling} scaling: {label}")
            ax.legend(fontsize=7)
    fig.suptitle("Fig. 11: QoI distributions of valid generated molecules (KDE)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig12(curve, n_weights, info, path):
    plt = _common.pyplot()

    D = n_weights
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.asarray(curve["rank"]) / D, curve["kappa"], color="tab:blue")
    ax.axhline(0.95, color="grey", lw=0.8, ls=":")
    ax.axvline(info["share_for_95pct"], color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlim(1 / D, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("share of weights (sorted by activity score)")
    ax.set_ylabel("cumulative activity share")
    ax.set_title(f"Fig. 12: cumulative activity, d = {info['d']}, D = {D}\n"
                 f"{100 * info['share_for_95pct']:.2f} % of the weights carry 95 %")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------- report


def _fmt(x, nd=3):
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}g}"
    return str(x)


def _pattern_checks(summary, d_max):
    """The paper's qualitative claims, checked one by one on this run."""
    get = {r["config"]: r for r in summary}
    base = get["baseline"]
    lines = []
    diffs = [(d, get[f"standard d={d}"]["valid_share"] - base["valid_share"],
              math.hypot(get[f"standard d={d}"]["valid_share_se"], base["valid_share_se"]))
             for d in range(1, d_max + 1)]
    ok = all(abs(x) <= 3 * se for _, x, se in diffs)
    lines.append(f"- Standard scaling indistinguishable from the baseline (valid share within 3 standard errors): "
                 f"{'yes' if ok else 'NO'} (differences "
                 + ", ".join(f"d={d}: {100 * x:+.2f} pp ± {100 * se:.2f}" for d, x, se in diffs) + ").")
    shares = [get[f"mean d={d}"]["valid_share"] for d in range(1, d_max + 1)]
    below = all(x < base["valid_share"] for x in shares)
    falling = all(b < a for a, b in zip(shares[:-1], shares[1:], strict=True))
    lines.append(f"- Mean scaling loses validity against the baseline at every d: {'yes' if below else 'NO'}; "
                 f"and falls monotonically with d: {'yes' if falling else 'NO'} ("
                 + " → ".join(f"{100 * x:.1f} %" for x in [base["valid_share"]] + shares) + ").")
    top = get[f"mean d={d_max}"]
    lines.append(f"- Mean scaling at d = {d_max} lengthens sequences: mean length {top['length_mean']:.1f} vs "
                 f"{base['length_mean']:.1f} tokens, p95 {top['length_p95']:.0f} vs {base['length_p95']:.0f}, "
                 f"{top['at_max_len']} vs {base['at_max_len']} at the maximum length: "
                 f"{'yes' if top['length_mean'] > base['length_mean'] else 'NO'}.")
    lines.append(f"- Mean scaling at d = {d_max} widens SlogP: std {top['slogp_std']:.2f} vs {base['slogp_std']:.2f}, "
                 f"share with SlogP > 5 {100 * top['slogp_gt5_share']:.1f} % vs {100 * base['slogp_gt5_share']:.1f} %: "
                 f"{'yes' if top['slogp_std'] > base['slogp_std'] else 'NO'}.")
    return lines


def _reading(ctx, d_max):
    """What the numbers say about the paper's pattern, and why where it differs (computed, not hand-written)."""
    get = {r["config"]: r for r in ctx["summary"]}
    base = get["baseline"]
    lines = []
    parts = []
    for d in range(1, d_max + 1):
        r = get[f"mean d={d}"]
        diff = r["valid_share"] - base["valid_share"]
        se = math.hypot(r["valid_share_se"], base["valid_share_se"])
        parts.append(f"d={d}: {100 * diff:+.1f} pp ({diff / se:+.1f} SE)")
    lines.append("- Mean scaling's valid share against the baseline: " + "; ".join(parts) + ".")
    mean_rows = [r for r in ctx["posterior"] if r["scaling"] == "mean"]
    if mean_rows:
        lines.append("- Mean scaling's weight perturbation: σ0 by empirical Bayes "
                     + ", ".join(f"{r['sigma0']:.3g}" for r in mean_rows) + " and RMS perturbation norm "
                     "sqrt(Σ σ_j²) " + ", ".join(f"{r['perturbation_norm_rms']:.3g}" for r in mean_rows)
                     + f" at d = 1…{len(mean_rows)}. With β = 1 the contraction is small, so σ_j ≈ σ0: validity "
                     "follows the size of the perturbation, which is set by the prior scale at each d.")
    ev = ctx["eigen_main"]["eigenvalues"]
    if len(ev) >= 2:
        lines.append(f"- λ2/λ1 = {ev[1] / ev[0]:.2f}: the top two directions are close in curvature, so which one a "
                     "short Lanczos run (or a small subsample) returns as p1 can change; that is what the low "
                     "replica alignments of Fig. 9 show (a value near 0 is p1 and p2 swapped).")
    return lines


def figure_names(out: str) -> list[str]:
    return [out + suffix for suffix in ("_fig9_alignment.png", "_fig10_lengths.png", "_fig11_qoi.png",
                                        "_fig12_activity.png")]


def render(ctx: dict, table: pd.DataFrame) -> str:
    """The markdown report from the results JSON and the alignment table (``*_alignment.csv``)."""
    args, summ = argparse.Namespace(**ctx["args"]), ctx["summary"]
    L = []
    L.append("# SMILES LSTM: GLAS study (paper §2.4, Table 1, Fig. 9 to 12)\n")
    L.append(f"Command: `{ctx['command']}`  ")
    L.append(f"Model: `{args.model}` (epoch {ctx['checkpoint']['epoch']}, "
             f"D = {ctx['n_weights']} weights; last training record: {ctx['checkpoint']['last']})  ")
    L.append(f"Curvature: N_sub = {args.n_sub} training SMILES = N = {ctx['n_records']} tokens; d_max = {args.d_max}, "
             f"l = {args.lanczos_steps} Lanczos steps.  ")
    L.append(f"Generation: {args.n_generate} SMILES per configuration (max length {args.max_len}), a fresh weight "
             f"sample every {args.block_size} molecules; common random numbers across configurations.  ")
    L.append(f"Runtime: {ctx['runtime']['cpu_s'] / 60:.1f} min CPU, {ctx['runtime']['wall_s'] / 60:.1f} min wall "
             f"({args.threads} thread(s); the machine was shared, so wall > CPU).\n")
    if ctx.get("notes"):
        L.append("## Notes\n")
        L += [f"- {n}" for n in ctx["notes"]]
        L.append("")
    L.append("## Pattern checks (computed from the tables below)\n")
    L += _pattern_checks(ctx["summary"], args.d_max)
    L.append("")
    L.append("## Reading\n")
    L += _reading(ctx, args.d_max)
    L.append("")
    L.append("## Table 1: valid SMILES\n")
    L.append("| d | baseline | standard (β = N) | mean (β = 1) | paper: baseline / std / mean (of 10k) |")
    L.append("|---|---|---|---|---|")
    get = {r["config"]: r for r in summ}
    for d in range(1, args.d_max + 1):
        b, s, m = get["baseline"], get[f"standard d={d}"], get[f"mean d={d}"]
        paper = " / ".join(str(PAPER_TABLE1.get(k, "-")) for k in ("baseline", ("standard", d), ("mean", d)))
        cells = [f"{r['valid']}/{r['n']} ({100 * r['valid_share']:.1f} %)" for r in (b, s, m)]
        L.append(f"| {d} | " + " | ".join(cells) + f" | {paper} |")
    L.append("")
    L.append("## Generated sequences and QoIs (QoIs over valid molecules)\n")
    cols = ["config", "valid", "unique_valid", "identical_to_baseline", "length_mean", "length_median", "length_p95",
            "at_max_len", "mol_wt_mean", "mol_wt_std", "sa_score_mean", "sa_score_std", "slogp_mean", "slogp_std",
            "slogp_p95", "slogp_gt5_share"]
    L.append("| " + " | ".join(cols) + " |")
    L.append("|" + "---|" * len(cols))
    for r in summ:
        L.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    L.append("")
    L.append("Between weight samples: each block of molecules uses one weight sample; the valid share per block "
             "(median, 10 % and 90 % quantiles) and the standard error of the valid share over blocks. "
             "`valid_len_ge100`: valid molecules of 100 or more tokens.\n")
    cols = ["config", "valid_share", "valid_share_se", "block_valid_median", "block_valid_p10", "block_valid_p90",
            "valid_len_ge100"]
    L.append("| " + " | ".join(cols) + " |")
    L.append("|" + "---|" * len(cols))
    for r in summ:
        L.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    L.append("")
    L.append("## Posterior (σ0 by empirical Bayes at each d)\n")
    L.append("| scaling | β | d | σ0 | σ_j | contraction c_j |")
    L.append("|---|---|---|---|---|---|")
    for r in ctx["posterior"]:
        L.append(f"| {r['scaling']} | {r['beta']:.6g} | {r['d']} | {r['sigma0']:.4g} | "
                 f"{', '.join(f'{x:.3g}' for x in r['sigma_j'])} | {', '.join(f'{x:.4f}' for x in r['contraction'])} |")
    L.append("")
    ev = ctx["eigen_main"]
    L.append(f"Eigenvalues of the main run: {', '.join(f'{x:.5g}' for x in ev['eigenvalues'])}; relative residuals "
             f"{', '.join(f'{x:.2e}' for x in ev['relative_residuals'])} after {ev['n_matvecs']} products.\n")
    L.append("## Fig. 9: subsampling (|⟨p1, p1_ref⟩| and the replica matrix)\n")
    L.append("| N_sub | mean N (tokens) | λ1 (mean) | min / mean \\|⟨p1_i, p1_j⟩\\| (i ≠ j) "
             "| \\|⟨p1, p1_ref⟩\\| per replica | max rel. residual |")
    L.append("|---|---|---|---|---|---|")
    for s in ctx["summary_alignment"]:
        size = s["subsample_size"]
        t = table[(table.run == "replica") & (table.subsample_size == size)]
        refs = ", ".join(f"{x:.3f}" for x in t.alignment_to_reference)
        L.append(f"| {size} | {t.n_records.mean():.0f} | {t.lambda_1.mean():.4g} | {s['min_replica_alignment']:.3f} / "
                 f"{s['mean_replica_alignment']:.3f} | {refs} | {t.max_relative_residual.max():.1e} |")
    ref = table[table.run == "reference"]
    if len(ref):
        L.append(f"\nReference run: N_sub = {int(ref.subsample_size.iloc[0])} ({int(ref.n_records.iloc[0])} tokens), "
                 f"λ1 = {float(ref.lambda_1.iloc[0]):.4g}, "
                 f"max relative residual {float(ref.max_relative_residual.iloc[0]):.1e}.")
    L.append("\nReplica matrices |⟨p1_i, p1_j⟩|:\n")
    for size, A in ctx["replica_alignment"].items():
        L.append(f"- N_sub = {size}: " + "; ".join("[" + ", ".join(f"{x:.3f}" for x in row) + "]" for row in A))
    L.append("")
    act = ctx["activity"]
    L.append("## Fig. 12: activity scores (d = 2)\n")
    L.append(f"{act['weights_for_95pct']} of {act['n_weights']} weights ({100 * act['share_for_95pct']:.2f} %) "
             f"carry 95 % of the activity; 50 %: {100 * act['share_for_50pct']:.3f} %, "
             f"90 %: {100 * act['share_for_90pct']:.2f} %, "
             f"99 %: {100 * act['share_for_99pct']:.2f} % (paper: 7.6 % for 95 %).\n")
    L.append("## Timings\n")
    L.append("| stage | CPU min | wall min |")
    L.append("|---|---|---|")
    for k, v in ctx["timings"].items():
        L.append(f"| {k} | {v['cpu_s'] / 60:.1f} | {v['wall_s'] / 60:.1f} |")
    probe = ctx["probe"]
    L.append(f"\nProbe: GGN product {1e3 * probe['ggn_cpu_s_per_sequence_product']:.1f} ms CPU per sequence; "
             "generation "
             f"{1e3 * probe['gen_cpu_s_per_molecule']:.1f} ms CPU per molecule at θ0.\n")
    stem = "paper_smiles_quick" if args.quick else "paper_smiles"
    L.append("Figures: " + ", ".join(f"`{name}`" for name in figure_names(stem)))
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("glas_sklearn").setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    if args.report_only:
        report(args.out)
        return
    total = Clock()
    command = _common.command_line(__file__, argv)
    logger.info("config: %s", vars(args))

    model, vocab = load_model(args.model, args.vocab)
    ckpt = torch.load(args.model, map_location="cpu", weights_only=True)
    history = ckpt.get("history", [])
    checkpoint = {"epoch": int(ckpt.get("epoch", -1)), "last": history[-1] if history else None}
    n_weights = sum(p.numel() for p in model.parameters())
    logger.info("model: epoch %s, %d weights; last record %s", checkpoint["epoch"], n_weights, checkpoint["last"])
    train, X, mask = load_training_data(vocab)
    logger.info("training SMILES: %d, padded length %d, %d tokens", len(train), X.shape[1], int(mask.sum()))

    timings = {}
    clock = Clock()
    probe = timing_probe(model, vocab, train, args)
    timings["timing probe"] = clock.read()
    if args.probe_only:
        return

    res, timings["subsampling study (all eigen runs)"] = subsampling_study(model, X, mask, args)
    table = res["table"]
    main_eig = res["eigen"][(args.n_sub, 0)]
    main_row = table[(table.run == "replica") & (table.subsample_size == args.n_sub) & (table.replica == 0)].iloc[0]
    n_records = int(main_row.n_records)
    table.to_csv(args.out + "_alignment.csv", index=False)

    posts, post_rows = build_posteriors(model, main_eig, n_records, args.d_max)
    for r in post_rows:
        logger.info("posterior %s d=%d: beta=%.6g sigma0=%.4g sigma_j=%s contraction=%s", r["scaling"], r["d"],
                    r["beta"], r["sigma0"], r["sigma_j"], r["contraction"])
    d_act = min(2, args.d_max)
    kappa, act = activity_summary(posts["mean"], d_act)
    logger.info("activity (d=%d): %.2f %% of the weights carry 95 %%", d_act, 100 * act["share_for_95pct"])

    clock = Clock()
    df, gen_timings = generate_configs(model, vocab, posts, args)
    timings["generation + RDKit (7 configurations)"] = clock.read()
    df.to_csv(args.out + "_generated.csv.gz", index=False, compression="gzip")
    summ = summarize(df, args.max_len)

    runtime = total.read()
    notes = []
    if args.n_generate != 10000:
        notes.append(f"{args.n_generate} SMILES per configuration instead of the paper's 10k (CPU budget); "
                     "compare shares, not counts.")
    if args.quick:
        notes.append("--quick smoke run: tiny sizes, not a result.")
    idx = np.unique(np.geomspace(1, len(kappa), 600).astype(int)) - 1  # Fig. 12 curve, log-spaced
    saved_args = {k: (_common.repo_path(v) if k in ("model", "vocab", "out", "out_dir") else v)
                  for k, v in vars(args).items()}
    ctx = {"args": saved_args, "checkpoint": checkpoint, "n_weights": n_weights,
           "n_records": n_records, "summary": summ.to_dict("records"), "posterior": post_rows, "probe": probe,
           "runtime": runtime,
           "eigen_main": {"eigenvalues": [float(x) for x in main_eig.eigenvalues],
                          "relative_residuals": [float(x) for x in main_eig.relative_residuals],
                          "n_matvecs": main_eig.n_matvecs, "converged": main_eig.converged},
           "summary_alignment": res["summary"].to_dict("records"),
           "replica_alignment": {str(k): v.tolist() for k, v in res["replica_alignment"].items()},
           "reference_alignment": {str(k): v.tolist() for k, v in res["reference_alignment"].items()},
           "activity": act, "activity_curve": {"rank": (idx + 1).tolist(), "kappa": kappa[idx].tolist()},
           "timings": {**timings, **{f"  {k}": v["total"] for k, v in gen_timings.items()}},
           "notes": notes, "paper_table1": {str(k): v for k, v in PAPER_TABLE1.items()}}
    _common.write_results(args.out + ".json", ctx, command=command)
    report(args.out)
    logger.info("done in %.1f min CPU, %.1f min wall; wrote %s.{json,md,_alignment.csv,_generated.csv.gz} and 4 PNGs",
                runtime["cpu_s"] / 60, runtime["wall_s"] / 60, args.out)
    for r in summ.to_dict("records"):
        logger.info("%-12s valid %d/%d, length mean %.1f, SlogP>5 %.3f", r["config"], r["valid"], r["n"],
                    r["length_mean"], r["slogp_gt5_share"])


def report(out: str) -> None:
    """Figures (from the CSVs) and the report (from the JSON and the alignment CSV) of a run's files."""
    ctx = _common.read_results(out + ".json")
    args = argparse.Namespace(**ctx["args"])
    table = pd.read_csv(out + "_alignment.csv")
    df = pd.read_csv(out + "_generated.csv.gz")
    res = {"table": table,
           "replica_alignment": {int(k): np.asarray(v) for k, v in ctx["replica_alignment"].items()},
           "reference_alignment": {int(k): np.asarray(v) for k, v in ctx["reference_alignment"].items()}}
    figures = figure_names(out)
    fig9(res, args, figures[0])
    fig10(df, args, figures[1])
    fig11(df, args, figures[2])
    fig12(ctx["activity_curve"], ctx["n_weights"], ctx["activity"], figures[3])
    _common.write_report(out + ".md", render(ctx, table))


if __name__ == "__main__":
    main()
