"""Command-line interface: ``glas-sklearn demo`` and friends."""

from __future__ import annotations

import argparse
import logging
import sys
import time

__all__ = ["main"]


def _demo_curvature(args) -> int:
    """Top eigenpairs of the GGN of a small MLP trained on the embedded concrete data."""
    import numpy as np
    import torch

    from .datasets import load_concrete
    from .eigen import top_eigenpairs
    from .ggn import GGNOperator

    X, y = load_concrete()
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    Xt = torch.tensor(X, dtype=torch.float32)
    yt = torch.tensor(y[:, None], dtype=torch.float32)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 50), torch.nn.Tanh(), torch.nn.Linear(50, 50), torch.nn.Tanh(),
                              torch.nn.Linear(50, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(500):
        opt.zero_grad()
        loss = 0.5 * ((net(Xt) - yt) ** 2).mean()
        loss.backward()
        opt.step()
    t0 = time.perf_counter()
    op = GGNOperator(net, Xt)
    res = top_eigenpairs(op, args.k, random_state=0)
    print(f"8-50-50-1 MLP on concrete (D={op.shape[0]}, N={op.n_records}), train MSE {2 * loss.item():.4f}")
    print(f"top-{args.k} GGN eigenvalues in {time.perf_counter() - t0:.2f} s, {res.n_matvecs} products:")
    print(np.array2string(res.eigenvalues.numpy(), precision=4))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``glas-sklearn`` command."""
    parser = argparse.ArgumentParser(prog="glas-sklearn", description="Generalized Laplace active subspaces.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo on the embedded concrete data")
    demo.add_argument("--k", type=int, default=10, help="number of eigenpairs")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command == "demo":
        return _demo_curvature(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
