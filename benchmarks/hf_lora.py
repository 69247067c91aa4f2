"""A transformers model with LoRA adapters, wrapped as it comes: fit time and memory, NLL / ECE (issue 21).

Model: a BERT sequence classifier built from a config (offline, random "pretrained" weights; ``--hidden``,
``--layers``), LoRA of rank ``--rank`` on the query / value projections from peft, the classification head in
``modules_to_save``. Task (generated): token sequences of 8–T random tokens, right-padded with 0; label 1 when the
marker token occurs, 10 % of the labels flipped. Rows: ``--n-tune`` fine-tuning, ``--n-cal`` calibration (never
seen in fine-tuning), ``--n-test`` test.

The model is fine-tuned with Adam (lr 1e-2, batches of 32, ``--epochs`` epochs; the last epoch is timed), then
passed as it comes to ``LaplaceActiveSubspaceClassifier(module=model, prefit=True, padding_idx=0)`` with the
calibration rows as ``X_cal`` (no wrapper), in the default settings (low-rank posterior, split conformal,
σ0 by the NLL of half the calibration rows, linearised probit, d = ``--max-components``) and the paper's
(``posterior="subspace", calibration="coverage"``, sampled).

Measured per method: wall seconds of the fit (and its ratio to one fine-tuning epoch); the fit's peak memory as
the resident set size: Linux's high-water mark VmHWM, reset to the current RSS just before the fit through
``/proc/self/clear_refs`` (after glibc's ``malloc_trim``), minus the RSS before the fit; against D·d (the
eigenvectors, 4 bytes an entry in float32) and all the model's weights; whether the model's state_dict is
bit-identical after fit and predictions; test NLL, ECE (15 bins), accuracy, 90 % set coverage / size.
laplace-torch (its LLM path: a hand-written wrapper taking a dict of ``input_ids`` / ``attention_mask``, KFAC over
the same trainable parameters, prior precision by marginal likelihood, GLM predictive with probit) is run on the
same model when it imports, in a forked process capped at 12 GiB (a failure is reported in the report).

Usage
-----
    python benchmarks/hf_lora.py                 # the reported run
    python benchmarks/hf_lora.py --quick         # small smoke run, *_quick outputs
    python benchmarks/hf_lora.py --report-only   # the report again from hf_lora.json
"""

from __future__ import annotations

import argparse
import ctypes
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import torch

from glas_sklearn import LaplaceActiveSubspaceClassifier
from glas_sklearn.adapters import ModelAdapter
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.predictive import mean_set_size, prediction_sets, set_coverage

LEVEL = 0.9
MARKER, PAD = 1, 0
METHODS = [
    ("fine_tuned", "fine-tuned model (its own softmax)", None),
    ("default", "GLAS default: low-rank, conformal, σ0 by NLL, linearised, d = d_max", {}),
    ("paper", "GLAS paper: subspace, d by set coverage, sampled", dict(posterior="subspace", calibration="coverage")),
    ("laplace_torch", "laplace-torch: KFAC over the same parameters, marglik prior, GLM probit", None),
]


def marker_task(n: int, length: int, vocab: int, seed: int, flip: float = 0.1):
    rng = np.random.default_rng(seed)
    X = rng.integers(2, vocab, (n, length))
    lengths = rng.integers(8, length + 1, n)
    y = rng.integers(0, 2, n)
    for i in range(n):
        if y[i]:
            X[i, rng.integers(0, lengths[i])] = MARKER
        X[i, lengths[i]:] = PAD
    return X, np.where(rng.random(n) < flip, 1 - y, y)


def scores(probs: np.ndarray, labels: np.ndarray, sets: np.ndarray) -> dict:
    p_true = np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)
    return {"nll": float(-np.mean(np.log(p_true))), "ece": _common.ece(probs, labels),
            "accuracy": float((probs.argmax(1) == labels).mean()),
            "set_coverage": float(set_coverage(labels, sets)[0]), "set_size": float(mean_set_size(sets)[0])}


# ----------------------------------------------------------------------------------------------- memory
def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakRSS:
    """Peak resident memory of a block above the RSS before it (Linux: VmHWM reset through clear_refs)."""

    def __enter__(self):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        Path("/proc/self/clear_refs").write_text("5")
        self.before = _rss_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak_mib = (_rss_kib("VmHWM") - self.before) / 1024
        return False


# ------------------------------------------------------------------------------------------------ model
def build_model(args, seed: int):
    import peft
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                  num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                                  max_position_embeddings=args.length, num_labels=2)
    return peft.get_peft_model(transformers.BertForSequenceClassification(cfg),
                               peft.LoraConfig(task_type="SEQ_CLS", r=args.rank, target_modules=["query", "value"]))


def fine_tune(model, X, y, epochs: int, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    seconds = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for idx in torch.randperm(len(Xt), generator=gen).split(32):
            loss = model(input_ids=Xt[idx], attention_mask=(Xt[idx] != PAD).long(), labels=yt[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
    return seconds


def own_probs(model, X) -> np.ndarray:
    Xt = torch.as_tensor(X)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=Xt, attention_mask=(Xt != PAD).long()).logits
    model.train()
    return torch.softmax(logits.double(), -1).numpy()


def run_laplace_torch(model, data, args) -> dict:
    """laplace-torch's LLM path on the same trainable parameters (it needs the hand-written dict wrapper)."""
    from laplace import Laplace

    class DictInputs(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch):
            return self.inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def loader(X, y):
        Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
        rows = [{"input_ids": Xt[i], "attention_mask": (Xt[i] != PAD).long(), "labels": yt[i]} for i in range(len(Xt))]
        return torch.utils.data.DataLoader(rows, batch_size=32)

    wrapped = DictInputs(model).eval()
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        la = Laplace(wrapped, "classification", subset_of_weights="all", hessian_structure="kron",
                     dict_key_x="input_ids", dict_key_y="labels")
        la.fit(loader(*data["tune"]))
        la.optimize_prior_precision(method="marglik")
    seconds = time.perf_counter() - t0
    Xt = torch.as_tensor(data["test"][0])
    probs = []
    for i in range(0, len(Xt), 256):
        batch = {"input_ids": Xt[i:i + 256], "attention_mask": (Xt[i:i + 256] != PAD).long()}
        with torch.no_grad():
            probs.append(la(batch, pred_type="glm", link_approx="probit").double().numpy())
    model.train()
    p = np.concatenate(probs)
    out = scores(p, data["test"][1], prediction_sets(p, LEVEL))
    out.update({"seconds": seconds, "peak_rss_mib": mem.peak_mib, "n_params": int(la.n_params)})
    return out


def run_streamed_curvature(model, data, args) -> dict:
    """The curvature step alone (GGN → d_max eigenpairs → posterior) through fit_laplace_subspace with streamed
    products on mini-batches of 64 rows: the memory the posterior itself needs, without the estimator's cached
    linearisation of all rows."""
    X = torch.as_tensor(data["tune"][0])
    t0 = time.perf_counter()
    with warnings.catch_warnings(), PeakRSS() as mem:
        warnings.simplefilter("ignore")
        fit = fit_laplace_subspace(ModelAdapter(model, padding_idx=PAD), X, loss="cross_entropy",
                                   n_components=args.max_components, batch_size=64, reuse_linearization=False,
                                   posterior="low_rank", random_state=args.seed)
    return {"seconds": time.perf_counter() - t0, "peak_rss_mib": mem.peak_mib, "D": int(fit.posterior.n_weights),
            "K": int(fit.posterior.max_components), "eigen_products": int(fit.eigen.n_matvecs)}


def run(args) -> dict:
    n = args.n_tune + args.n_cal + args.n_test
    X, y = marker_task(n, args.length, args.vocab, seed=args.seed)
    data = {"tune": (X[:args.n_tune], y[:args.n_tune]),
            "cal": (X[args.n_tune:args.n_tune + args.n_cal], y[args.n_tune:args.n_tune + args.n_cal]),
            "test": (X[args.n_tune + args.n_cal:], y[args.n_tune + args.n_cal:])}
    model = build_model(args, args.seed)
    epoch_seconds = fine_tune(model, *data["tune"], epochs=args.epochs, seed=args.seed)
    n_all = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out = {"n_weights_all": n_all, "n_weights_trainable": n_trainable, "epoch_seconds": epoch_seconds[-1],
           "methods": {}}
    p = own_probs(model, data["test"][0])
    out["methods"]["fine_tuned"] = scores(p, data["test"][1], prediction_sets(p, LEVEL))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for key, _, params in METHODS:
        if params is None:
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings(), PeakRSS() as mem:
            warnings.simplefilter("ignore")
            clf = LaplaceActiveSubspaceClassifier(**_common.grouped(module=model, prefit=True, padding_idx=PAD,
                                                            max_components=args.max_components,
                                                            n_samples=args.n_samples, confidence_level=LEVEL,
                                                            random_state=args.seed, **params))
            clf.fit(*data["tune"], X_cal=data["cal"][0], y_cal=data["cal"][1])
        seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        probs = clf.predict_proba(data["test"][0])
        _, sets = clf.predict_set(data["test"][0])
        r = scores(probs, data["test"][1], sets[..., 0:1])
        unchanged = all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
        r.update({"seconds": seconds, "predict_seconds": time.perf_counter() - t0, "peak_rss_mib": mem.peak_mib,
                  "D": int(clf.n_weights_), "d": int(clf.n_components_), "K": int(clf.posterior_.max_components),
                  "sigma0": float(clf.sigma0_), "timings": dict(clf.timings_), "base_bit_identical": bool(unchanged),
                  "trainable_tensors": len(clf.trainable_parameters_),
                  "eigen_products": int(clf.eigen_info_["n_matvecs"])})
        out["methods"][key] = r
        print(f"[hf_lora] {key}: fit {seconds:.1f} s, NLL {r['nll']:.4f}, peak {mem.peak_mib:.1f} MiB", flush=True)
    out["curvature_streamed"] = run_streamed_curvature(model, data, args)
    result = run_capped(run_laplace_torch, model, data, args)
    if "error" in result:
        out["laplace_torch_error"] = result["error"]
    else:
        out["methods"]["laplace_torch"] = result
    return out


def _capped_child(queue, fn, cap_bytes, *fn_args) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))
    try:
        queue.put(fn(*fn_args))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which carries on
        queue.put({"error": f"{type(err).__name__}: {str(err)[:300]}"})


def run_capped(fn, *fn_args, cap_gib: float = 12.0) -> dict:
    """fn(*fn_args) in a forked process whose address space is capped at ``cap_gib`` GiB (an optional comparison
    that runs out of memory is reported, not fatal, and cannot take the machine down)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_capped_child, args=(queue, fn, int(cap_gib * 2**30), *fn_args))
    child.start()
    try:
        while True:
            try:
                return queue.get(timeout=5)
            except Exception:  # noqa: BLE001 - nothing yet: still running, or died without reporting
                if not child.is_alive() and queue.empty():
                    return {"error": f"the run ended without a result (exit code {child.exitcode})"}
    finally:
        child.join(timeout=10)


def render(results: dict) -> str:
    cfg, r = results["config"], results["run"]
    ft = r["methods"]["fine_tuned"]
    lines = [f"# Transformers + LoRA as they come: fit time, memory, NLL and ECE"
             f"{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])}).", "",
             f"BERT (hidden {cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads, vocabulary {cfg['vocab']}, "
             f"T = {cfg['length']}) with LoRA r = {cfg['rank']} on query/value and the head in modules_to_save: "
             f"{r['n_weights_trainable']:,} trainable of {r['n_weights_all']:,} weights. Marker-token task, 10 % "
             f"labels flipped; {cfg['n_tune']} fine-tuning rows ({cfg['epochs']} epochs, one epoch "
             f"{r['epoch_seconds']:.2f} s), {cfg['n_cal']} calibration rows, {cfg['n_test']} test rows; sets at "
             f"{LEVEL:.0%}. Memory: peak RSS of the fit above the RSS before it (VmHWM reset through "
             "/proc/self/clear_refs), against D·d·4 bytes (the float32 eigenvectors) and all weights (4 bytes each).",
             "", "| method | NLL | ECE | accuracy | set coverage | set size | fit s | fit / epoch | peak MiB | "
             "D·d MiB | d | base bit-identical |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, label, _ in METHODS:
        m = r["methods"].get(key)
        if m is None:
            continue
        cells = [label, f"{m['nll']:.4f}", f"{m['ece']:.4f}", f"{m['accuracy']:.3f}", f"{m['set_coverage']:.3f}",
                 f"{m['set_size']:.2f}"]
        if "seconds" in m:
            cells += [f"{m['seconds']:.1f}", f"{m['seconds'] / r['epoch_seconds']:.1f}", f"{m['peak_rss_mib']:.1f}"]
        else:
            cells += ["–"] * 3
        if "D" in m:
            identical = "yes" if m["base_bit_identical"] else "NO"
            cells += [f"{m['D'] * m['K'] * 4 / 2**20:.2f}", str(m["d"]), identical]
        else:
            cells += ["–"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    all_mib = r["n_weights_all"] * 4 / 2**20
    lines += ["", f"All weights: {all_mib:.2f} MiB; the trainable ones {r['n_weights_trainable'] * 4 / 2**20:.3f} MiB.",
              ""]
    cs = r.get("curvature_streamed")
    if cs is not None:
        lines += [f"The curvature step alone (`fit_laplace_subspace`, streamed products on mini-batches of 64 rows, "
                  f"K = {cs['K']} eigenpairs in {cs['eigen_products']} products): {cs['seconds']:.1f} s "
                  f"({cs['seconds'] / r['epoch_seconds']:.1f} epochs), peak {cs['peak_rss_mib']:.1f} MiB above the "
                  f"RSS before it, against D·K = {cs['D'] * cs['K'] * 4 / 2**20:.2f} MiB of float32 eigenvectors. "
                  "The estimator's fit caches the linearisation of all its rows when that fits a quarter of the "
                  "available memory (`reuse_linearization=\"auto\"`), which dominates its peak above.", ""]
    if "laplace_torch_error" in r:
        lines += [f"laplace-torch did not run here: {r['laplace_torch_error']}", ""]
    lines += ["## Against the issue's targets, computed", ""]
    for key in ("default", "paper"):
        m = r["methods"].get(key)
        if m is None:
            continue
        gap = m["nll"] - ft["nll"]
        lines.append(f"- {key}: test NLL {m['nll']:.4f} vs fine-tuned {ft['nll']:.4f} ({gap:+.4f}; target ≤ +0.01 "
                     f"{'met' if gap <= 0.01 else 'NOT met'}); posterior over D = {m['D']:,} trainable weights in "
                     f"{m['trainable_tensors']} tensors; base weights bit-identical: "
                     f"{'yes' if m['base_bit_identical'] else 'NO'}; timings "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in m["timings"].items()) + ".")
    lines.append("")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="a tiny model and 300 rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 64; quick 16)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs (default 5; quick 3)")
    p.add_argument("--n-tune", type=int, default=None, help="fine-tuning rows (default 600; quick 200)")
    p.add_argument("--n-cal", type=int, default=None, help="calibration rows (default 200; quick 60)")
    p.add_argument("--n-test", type=int, default=None, help="test rows (default 500; quick 100)")
    p.add_argument("--max-components", type=int, default=None, help="d_max (default 20; quick 5)")
    p.add_argument("--n-samples", type=int, default=None, help="posterior samples, paper setting (default 100)")
    args = p.parse_args(argv)
    quick = {"hidden": 16, "epochs": 3, "n_tune": 200, "n_cal": 60, "n_test": 100, "max_components": 5,
             "n_samples": 50}
    full = {"hidden": 64, "epochs": 5, "n_tune": 600, "n_cal": 200, "n_test": 500, "max_components": 20,
            "n_samples": 100}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.heads, args.length = 2, 16
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    json_path, md_path = _common.output_paths(args, "hf_lora")
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    results = _common.new_results(args)
    results["run"] = run(args)
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
