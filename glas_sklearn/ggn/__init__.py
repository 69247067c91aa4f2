"""The generalized Gauss-Newton matrix of a trained network as a matrix-free linear operator.

G = (1/N) Σ_n J_nᵀ H_n J_n (paper eqs. 28, 30), with J_n the Jacobian of the network output for record n with
respect to the trainable weights and H_n the Hessian of the loss with respect to that output:
the identity for the ½-squared loss and diag(p) − p pᵀ for softmax cross-entropy (analytic, p = softmax(f)),
in general whatever the :class:`~glas_sklearn.likelihoods.Likelihood`'s ``output_hessian_product`` gives.
With record weights w_n (``sample_weight``) G = Σ_n w_n J_nᵀ H_n J_n / Σ_n w_n: frequency weights, so an integer
weight is the same as repeating the record and a zero weight the same as dropping it.
G is never formed: G v is one Jacobian-vector product, a multiply by H at the output and one
vector-Jacobian product per mini-batch, summed over the N records. A block G V of k vectors is computed in
one pass per mini-batch: one forward pass, the k JVPs and VJPs vectorised with ``torch.func.vmap`` (in
memory-bounded chunks of columns), so the per-product overhead is paid once per block (``vectorize_blocks``).

The parts: the curvature protocol (_protocol.py), the operator (_operator.py), the records and mini-batches it
sums over (_records.py), single products through the cached or streamed linearisation (_linearization.py) and
vectorised block products (_blocks.py).
"""

from ._operator import GGNOperator
from ._protocol import CurvatureOperator

__all__ = ["CurvatureOperator", "GGNOperator"]
