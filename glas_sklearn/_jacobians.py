"""Products with the Jacobian of a bound model without forming it where possible: J t along many tangents (reverse
over reverse, or forward mode), an MLP's per-record Jacobians in factored form, and J Jᵀ per record.

:class:`JacobianProducts` extends :class:`~glas_sklearn._functional.BoundModel` (the per-record Jacobians) for the
posterior; :class:`LinearFactors` holds the factored Jacobians of a network of ``nn.Linear`` layers.
"""

from __future__ import annotations

import logging
import math

import torch
from torch.func import jvp, vjp, vmap

from ._functional import BoundModel, forward_ad_section

__all__ = ["JacobianProducts", "LinearFactors"]

logger = logging.getLogger(__name__)


class LinearFactors:
    """Per-record Jacobians of a network of ``nn.Linear`` layers in factored form: the weight gradient of output m
    of record i at a layer is the outer product g_i^m a_iᵀ of the gradient at the layer's output and its input
    (and g_i^m for the bias), so neither J Jᵀ nor J t needs the (c, M, D) Jacobians.

    Parameters
    ----------
    out_shape : tuple
        The per-record output shape.
    layers : list of (weight name, bias name or None, a, g)
        a of shape (c, in), g of shape (M, c, out) with M = prod(out_shape).
    """

    def __init__(self, out_shape: tuple, layers: list) -> None:
        self.out_shape = out_shape
        self.layers = layers

    def rows(self, sl: slice) -> LinearFactors:
        """The factors of the records ``sl``."""
        return LinearFactors(self.out_shape, [(w, b, a[sl], g[:, sl]) for w, b, a, g in self.layers])

    def gram(self, full_cov: bool = False) -> torch.Tensor:
        """J Jᵀ over the last output axis, float64: ``(c, *out)`` or ``(c, *out[:-1], M, M)``."""
        c = self.layers[0][2].shape[0]
        M = math.prod(self.out_shape)
        gram = torch.zeros(c, M, M, dtype=torch.float64, device=self.layers[0][2].device)
        for _, b, a, g in self.layers:
            g = g.to(torch.float64).transpose(0, 1)  # (c, M, out)
            gram += ((a.to(torch.float64) ** 2).sum(1) + (b is not None))[:, None, None] * (g @ g.transpose(1, 2))
        if not full_cov:
            return torch.diagonal(gram, dim1=1, dim2=2).reshape(c, *self.out_shape)
        lead, last = math.prod(self.out_shape[:-1]), self.out_shape[-1]  # the blocks over the last output axis
        blocks = torch.diagonal(gram.reshape(c, lead, last, lead, last), dim1=1, dim2=3)  # (c, last, last, lead)
        return torch.movedim(blocks, -1, 1).reshape(c, *self.out_shape[:-1], last, last)

    def bytes_per_tangent(self) -> int:
        """Bytes :meth:`projections` holds at once per tangent (the widest layer's products and their
        contraction)."""
        return max(3 * a.shape[0] * g.shape[-1] * g.element_size() + a.numel() * a.element_size()
                   for _, _, a, g in self.layers)

    def projections(self, tangents: dict) -> torch.Tensor:
        """J t_k for the tangents ``tangents`` (name → (k, *shape), e.g. ``ParameterLayout.unflatten_rows``): shape
        ``(c, *out, k)``. Per layer one batched product of the inputs with the k weight tangents (about one forward
        pass per tangent), then its contraction with g."""
        total = None
        for w, b, a, g in self.layers:
            V = tangents[w]  # (k, out, in)
            h = torch.matmul(a.to(V.dtype), V.transpose(1, 2))  # (k, c, out)
            if b is not None:
                h = h + tangents[b][:, None, :]
            part = torch.einsum("kco,mco->cmk", h, g.to(h.dtype))
            total = part if total is None else total + part
        return total.reshape(total.shape[0], *self.out_shape, total.shape[-1])


class JacobianProducts(BoundModel):
    """J t along tangents, the factored Jacobians of an MLP and J Jᵀ per record, for a class holding a
    ``functional_model`` (the posterior); each way remembers, per instance, whether the model allows it."""

    def tangent_products(self, Xb: torch.Tensor, tangents: torch.Tensor) -> torch.Tensor:
        """J(Xb) t_k for every row t_k of ``tangents`` (c, D): shape ``(c, nb, *out)``, in the weights' dtype.

        Reverse over reverse: J t = ∂/∂u ⟨Jᵀu, t⟩, the pullback of the (linear in u) pullback u ↦ Jᵀu, one
        forward pass and its pullback for all tangents, then one pass back through that pullback per tangent,
        ``torch.func.vmap``-ed over the tangents (a loop where the model does not allow it). Reverse mode keeps
        no state shared between threads, so threads compute their products at once. A model without a
        derivative of its backward pass falls back to forward-mode JVPs (:meth:`_forward_mode_products`), whose
        state torch keeps per process: one thread at a time there.
        """
        fm = self.functional_model
        batched = fm.layout.unflatten_rows(tangents)
        if getattr(self, "_reverse_jvp_ok", None) is not False:
            try:
                with fm.autodiff():
                    out, pull = vjp(lambda p: fm(Xb, p), fm.params0)
                    _, pull_pull = vjp(lambda u: pull(u)[0], torch.zeros_like(out))
                    if getattr(self, "_vmap_tangents_ok", None) is not False:
                        try:
                            (jt,) = vmap(pull_pull)(batched)
                            self._vmap_tangents_ok = True
                        except Exception as err:  # noqa: BLE001 - any failure of the vectorised path: a loop
                            if getattr(self, "_vmap_tangents_ok", None):
                                raise
                            logger.debug("vmap over tangents failed (%s); one tangent at a time", err)
                            self._vmap_tangents_ok = False
                    if getattr(self, "_vmap_tangents_ok", None) is False:
                        jt = torch.stack([pull_pull({n: t[k] for n, t in batched.items()})[0]
                                          for k in range(tangents.shape[0])])
                self._reverse_jvp_ok = True
                return jt.detach()
            except Exception as err:  # noqa: BLE001 - no double backward: forward mode
                if getattr(self, "_reverse_jvp_ok", None):
                    raise
                logger.debug("no derivative of the backward pass (%s); forward-mode JVPs", err)
                self._reverse_jvp_ok = False
        return self._forward_mode_products(Xb, batched, tangents.shape[0])

    def _forward_mode_products(self, Xb: torch.Tensor, batched: dict, count: int) -> torch.Tensor:
        """J(Xb) t_k by forward-mode JVPs, under :func:`forward_ad_section` (torch's forward-mode state is global
        to the process); ``vmap``-ed over the tangents where the model allows it, else one dual level each."""
        fm = self.functional_model

        def f(params):
            return fm(Xb, params)

        with forward_ad_section(), fm.autodiff():
            if getattr(self, "_vmap_jvp_ok", None) is not False:
                try:
                    out = vmap(lambda t: jvp(f, (fm.params0,), (t,))[1])(batched)
                    self._vmap_jvp_ok = True
                    return out.detach()
                except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back to a loop
                    if getattr(self, "_vmap_jvp_ok", None):
                        raise
                    logger.debug("vmap over JVP tangents failed (%s); computing them one by one", err)
                    self._vmap_jvp_ok = False
            cols = []
            for k in range(count):
                with torch.autograd.forward_ad.dual_level():
                    duals = {n: torch.autograd.forward_ad.make_dual(p, batched[n][k])
                             for n, p in fm.params0.items()}
                    primal, tangent = torch.autograd.forward_ad.unpack_dual(fm(Xb, duals))
                cols.append(torch.zeros_like(primal) if tangent is None else tangent.detach())
            return torch.stack(cols)

    def linear_factors(self, Xb: torch.Tensor) -> LinearFactors | None:
        """The per-record Jacobians of Xb in factored form, for a network whose trainable weights all sit in
        ``nn.Linear`` layers, each called once on one vector per record (an MLP): one forward pass and M passes
        back (:class:`LinearFactors`). None for other networks (found on the first call and remembered); the
        factors are checked once against the per-record Jacobians."""
        if getattr(self, "_linear_factors_ok", None) is False:
            return None
        fm = self.functional_model
        params = {n: p.detach().requires_grad_(True) for n, p in fm.params0.items()}
        with fm.autodiff():
            traced = fm.linear_taps(Xb, params)
            if traced is None:
                self._linear_factors_ok = False
                return None
            out, taps = traced
            flat = out.reshape(out.shape[0], -1)
            outputs = [o for _, _, _, o in taps]
            grads = [torch.autograd.grad(flat[:, m].sum(), outputs, retain_graph=m < flat.shape[1] - 1,
                                         allow_unused=True) for m in range(flat.shape[1])]
        layers = [(w, b, a.detach(), torch.stack([torch.zeros_like(o) if gm[i] is None else gm[i] for gm in grads]))
                  for i, (w, b, a, o) in enumerate(taps)]
        factors = LinearFactors(tuple(out.shape[1:]), layers)
        if getattr(self, "_linear_factors_ok", None) is None:
            # once: the factors must give what the Jacobians give (a weight used outside its layer, or records that
            # see each other, would not)
            jac = self.record_jacobians(Xb[:2])
            tangents = torch.randn(3, self.layout.size, generator=torch.Generator().manual_seed(0),
                                   dtype=self.layout.dtype).to(jac.device)
            ref = jac @ tangents.T
            got = factors.rows(slice(0, 2)).projections(self.layout.unflatten_rows(tangents))
            tol = 1e3 * torch.finfo(self.layout.dtype).eps * float(ref.abs().max().clamp_min(1e-30))
            self._linear_factors_ok = bool((got - ref).abs().max() <= tol)
            if not self._linear_factors_ok:
                logger.debug("layer factors disagree with the Jacobians; per-record Jacobians instead")
                return None
        return factors

    def record_gram(self, Xb: torch.Tensor, full_cov: bool = False, *, jacobians: bool = True) -> torch.Tensor | None:
        """J(x) J(x)ᵀ over the last output axis for every record of Xb, in float64: ‖J_m(x)‖² of shape ``(c, *out)``,
        or the (M × M) blocks, shape ``(c, *out[:-1], M, M)`` (``full_cov``).

        From :meth:`linear_factors` where the network allows it (no per-record Jacobians), else from the per-record
        Jacobians (:meth:`record_jacobians`); with ``jacobians=False`` None then.
        """
        factors = self.linear_factors(Xb)
        if factors is not None:
            return factors.gram(full_cov)
        return self._jacobian_gram(self.record_jacobians(Xb), full_cov) if jacobians else None

    @staticmethod
    def _jacobian_gram(jac: torch.Tensor, full_cov: bool) -> torch.Tensor:
        """J Jᵀ of per-record Jacobians ``(c, *out, D)``, in float64 (products in the Jacobians' dtype)."""
        if full_cov:
            return (jac @ jac.transpose(-1, -2)).to(torch.float64)
        return torch.linalg.vector_norm(jac, dim=-1).to(torch.float64).square_()

    def flops_per_record(self, X: torch.Tensor) -> float | None:
        """Floating-point operations of one forward pass on the first record of ``X`` (torch's FlopCounterMode:
        matrix products and convolutions), None where they cannot be counted."""
        try:
            from torch.utils.flop_counter import FlopCounterMode

            with FlopCounterMode(display=False) as counter, torch.no_grad(), self.functional_model.autodiff():
                self.functional_model(X[:1])
            return float(counter.get_total_flops())
        except Exception as err:  # noqa: BLE001 - an op the counter cannot follow: no estimate
            logger.debug("cannot count the forward pass's operations (%s)", err)
            return None
