"""Functional access to a torch model's weights, without ever writing into the model.

Every module that evaluates the network at perturbed weights or differentiates it goes through
these helpers: the trainable parameters are addressed as one flat vector (in ``named_parameters()``
order), and the network is called with ``torch.func.functional_call`` on a view of the model in
evaluation mode. :class:`FunctionalModel` binds a model once in that form (layout, θ0, eval view,
input checks, and the :class:`~glas_sklearn.adapters.ModelAdapter` that calls it: keyword inputs and attention
masks, ``ModelOutput`` → logits); the GGN operator and the posterior both hold one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import threading
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn
from torch.func import functional_call, jacrev, vjp, vmap

try:  # torch ≥ 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover - older torch: its attention kernels are left as they are
    SDPBackend = sdpa_kernel = None

from ._checks import check_finite_tensor
from .adapters import ModelAdapter, as_adapter, unwrap_model

__all__ = ["BoundModel", "FunctionalModel", "ParameterLayout", "eval_view", "autodiff_context", "forward",
           "forward_ad_section", "model_outputs", "structure_copy"]

logger = logging.getLogger(__name__)

# Output cotangents pulled back at once by BoundModel._pullback_jacobians (its groups of records hold this many
# outputs): the vectorised backward pass costs this many backward passes over the group.
_PULLBACK_COTANGENTS = 32


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of a model's trainable parameters in the flat weight vector.

    Attributes
    ----------
    names : tuple of str
        Parameter names, in ``model.named_parameters()`` order (trainable ones only).
    shapes : tuple of torch.Size
    numels : tuple of int
    dtype, device
        The flat vector's dtype (that of the parameters; with mixed precisions, the widest, e.g. float32 for
        peft's float32 LoRA matrices beside a bfloat16 ``modules_to_save`` head) and their device (all trainable
        parameters must share one).
    param_dtypes : tuple of torch.dtype or None
        Each parameter's own dtype when they differ (None when all are ``dtype``): :meth:`unflatten` casts each
        part back to it, :meth:`flatten` casts to ``dtype``.
    """

    names: tuple
    shapes: tuple
    numels: tuple
    dtype: torch.dtype
    device: torch.device
    param_dtypes: tuple | None = None

    @classmethod
    def from_model(cls, model: nn.Module) -> "ParameterLayout":
        """The layout of ``model``'s trainable parameters (of the model it wraps, for a ModelAdapter)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected a torch.nn.Module, got {type(model).__name__}.")
        model = unwrap_model(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                f"The model {type(model).__name__} has no trainable parameters "
                "(none with requires_grad=True); there is no weight posterior to build."
            )
        dtypes = {p.dtype for _, p in named}
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise TypeError(
                f"All trainable parameters must live on one device; found {sorted(map(str, devices))}. "
                "Move the model with model.to(device) first."
            )
        if not all(dt.is_floating_point for dt in dtypes):
            raise TypeError(f"Trainable parameters must be floating point, got {sorted(map(str, dtypes))}.")
        dtype = functools.reduce(torch.promote_types, sorted(dtypes, key=str))
        return cls(
            names=tuple(n for n, _ in named),
            shapes=tuple(p.shape for _, p in named),
            numels=tuple(p.numel() for _, p in named),
            dtype=dtype,
            device=named[0][1].device,
            param_dtypes=None if len(dtypes) == 1 else tuple(p.dtype for _, p in named),
        )

    @property
    def size(self) -> int:
        """D, the total number of trainable weights."""
        return int(sum(self.numels))

    def _own_dtypes(self, parts: dict) -> dict:
        if self.param_dtypes is None:
            return parts
        return {n: t.to(dt) for (n, t), dt in zip(parts.items(), self.param_dtypes, strict=True)}

    def flatten(self, tensors) -> torch.Tensor:
        """Concatenate a dict (by name) or sequence (in order) of parameter-shaped tensors (in ``dtype``)."""
        if isinstance(tensors, dict):
            tensors = [tensors[n] for n in self.names]
        return torch.cat([t.reshape(-1).to(self.dtype) for t in tensors])

    def unflatten(self, vector: torch.Tensor) -> dict:
        """Split a flat vector of length D into a dict of parameter-shaped views (copies in their own dtype for
        parameters of a narrower one)."""
        parts = torch.split(vector, self.numels)
        return self._own_dtypes({n: part.view(shape)
                                 for n, part, shape in zip(self.names, parts, self.shapes, strict=True)})

    def unflatten_rows(self, rows: torch.Tensor) -> dict:
        """Split a (c, D) block of flat weight vectors into a dict of ``(c, *shape)`` tensors (for ``vmap``)."""
        parts = torch.split(rows, self.numels, dim=1)
        return self._own_dtypes({n: part.reshape(rows.shape[0], *shape)
                                 for n, part, shape in zip(self.names, parts, self.shapes, strict=True)})

    def parameters_of(self, model: nn.Module) -> torch.Tensor:
        """θ0: a detached copy of the model's trainable weights as one flat vector (in ``dtype``)."""
        params = dict(unwrap_model(model).named_parameters())
        return torch.cat([params[n].detach().reshape(-1).to(self.dtype) for n in self.names]).clone()


def eval_view(model: nn.Module) -> nn.Module:
    """The model itself if every submodule is in eval mode, else an eval-mode copy sharing its tensors.

    The copy duplicates only the module structure (parameters and buffers are shared, not copied),
    so the user's model keeps its own train/eval flags and nothing is ever written into it.
    """
    if not any(m.training for m in model.modules()):
        return model
    return structure_copy(model).eval()


def _has_rnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.RNNBase) for m in model.modules())


# torch's forward-mode AD is process-global: ``torch.autograd.forward_ad.dual_level`` enters the one global level
# (its C++ levels are shared by all threads) and ``torch.func.jvp`` keeps a module-global nesting count. Two threads
# inside forward-mode sections at once corrupt each other (wrong tangents, "no level exists", an INTERNAL ASSERT that
# leaves the process unable to run forward AD again), so every forward-mode section of the library holds this lock.
_FORWARD_AD_LOCK = threading.RLock()


def forward_ad_section() -> contextlib.AbstractContextManager:
    """The process-wide lock every forward-mode AD section (``torch.func.jvp``, ``forward_ad.dual_level``) holds.

    torch's forward-mode AD state (the dual level, the JVP nesting count) is global to the process, not per
    thread, so only one thread at a time may be inside a forward-mode section; re-entrant within a thread.
    """
    return _FORWARD_AD_LOCK


class _SharedFlag:
    """A process-global torch setting switched on while any thread is inside a block that needs it, restored when
    the last one leaves (entering and leaving in every order across threads leaves the original setting)."""

    def __init__(self, make_context) -> None:
        self._make_context = make_context
        self._lock = threading.Lock()
        self._depth = 0
        self._context = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                context = self._make_context()
                context.__enter__()
                self._context = context
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    context, self._context = self._context, None
                    context.__exit__(None, None, None)


class _OneDNNOff:
    """oneDNN off and back, and no other oneDNN setting touched: ``torch.backends.mkldnn.flags(enabled=False)`` also
    sets TF32 (a UserWarning on every entry and exit in CPU builds, which silencing would need the process-wide
    warning filters for) and, in newer torch, the fp32 precision. torch's own getter and setter of the flag,
    as ``torch.backends.mkldnn.set_flags`` calls them in every torch release since 2.1."""

    def __enter__(self) -> None:
        self._was = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)

    def __exit__(self, *exc) -> None:
        torch._C._set_mkldnn_enabled(self._was)


# oneDNN off (forward-mode AD through nn.LSTM fails with it) and attention on its math kernel: global flags, set
# while any thread needs them and restored when the last one is done.
_ONEDNN_OFF = _SharedFlag(_OneDNNOff)
_SDPA_MATH = _SharedFlag(lambda: sdpa_kernel([SDPBackend.MATH])) if sdpa_kernel is not None else None


@contextlib.contextmanager
def autodiff_context(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Gradients on; ``scaled_dot_product_attention`` on its math kernel (the fused flash / memory-efficient
    kernels, which transformers' attention layers call, have neither forward-mode AD nor a double backward);
    and oneDNN off for recurrent layers on CPU (forward-mode AD through ``nn.LSTM`` fails with oneDNN). The
    last two are process-global torch flags: they are set while any thread is inside such a block and restored
    when the last one leaves, so concurrent predictions neither race on them nor leave them changed."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        if _SDPA_MATH is not None:
            stack.enter_context(_SDPA_MATH.held())
        if device.type == "cpu" and _has_rnn(model):
            stack.enter_context(_ONEDNN_OFF.held())
        yield


def structure_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module structure sharing every tensor it holds (parameters, buffers and plain tensor
    attributes): cheap, and ``torch.func.functional_call`` may swap tensors in it without touching ``model``."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    for m in model.modules():
        memo.update({id(v): v for v in vars(m).values() if isinstance(v, torch.Tensor)})
    return copy.deepcopy(model, memo)


def forward(model: nn.Module, params: dict, inputs) -> torch.Tensor:
    """Evaluate ``model`` at the weights ``params`` (a name → tensor dict) on ``inputs`` (positionally)."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return functional_call(model, params, args)


def model_outputs(model: nn.Module, X: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """The model's predictions on every row of ``X`` at its own weights: called through its
    :class:`~glas_sklearn.adapters.ModelAdapter` on an eval-mode view (a plain call: nothing is swapped into the
    model, so threads may share it), without building a graph, ``batch_size`` rows at a time (all at once when
    None)."""
    adapter = as_adapter(model)
    view = eval_view(adapter.model)
    size = batch_size or X.shape[0]

    def call(xb):
        args, kwargs = adapter.arguments(xb)
        return adapter.select_output(view(*args, **kwargs))

    with autodiff_context(view, X.device), torch.no_grad():
        return torch.cat([call(X[i:i + size]) for i in range(0, X.shape[0], size)])


def _tap(taps: list, weight: str, bias: str | None, module, args, output) -> None:
    taps.append((weight, bias, args[0], output))


class FunctionalModel:
    """A trained model as a pure function of its weights: f(x; θ), with θ0 its trained weights.

    The one binding of a model that the GGN operator and the posterior share. It records the layout of the
    trainable weights in the flat vector, a detached copy θ0 of them, an eval-mode view of the model
    (:func:`eval_view`) and the :class:`~glas_sklearn.adapters.ModelAdapter` that calls it; the model is only
    ever called through ``torch.func.functional_call`` and is never written into. Only the trainable weights
    are substituted in a call: frozen ones (a transformer's base under LoRA) and buffers are the model's own
    tensors, read in place and never copied.

    Parameters
    ----------
    model : torch.nn.Module or ModelAdapter
        The trained network, or an adapter naming how to call it. Its trainable parameters
        (``requires_grad=True``, in ``named_parameters()`` order, under the wrapped model's names for an
        adapter) are the D weights; they must share one floating dtype and one device.

    Attributes
    ----------
    layout : ParameterLayout
        Names, shapes and offsets of the weights in the flat vector.
    module : torch.nn.Module
        The eval-mode view of the model (the model itself when it is already in eval mode; the wrapped model
        for an adapter).
    adapter : ModelAdapter
        How the model is called (its input keywords, attention mask and output), wrapping ``module``.
    theta0 : torch.Tensor of shape (D,)
        The trained weights, a detached copy taken at construction (later changes to the model do not move it).
    params0 : dict
        θ0 as a name → tensor dict of views into ``theta0``.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Linear(3, 2).double()
    >>> f = FunctionalModel(net)
    >>> f.n_weights, f.dtype
    (8, torch.float64)
    >>> x = torch.ones(4, 3, dtype=torch.float64)
    >>> torch.equal(f(x), net(x)), f(x, f.unflatten(torch.zeros(8, dtype=torch.float64))).abs().max().item()
    (True, 0.0)
    """

    def __init__(self, model: nn.Module) -> None:
        given = as_adapter(model)
        self.layout = ParameterLayout.from_model(given.model)
        self.module = eval_view(given.model)
        self.adapter = ModelAdapter(self.module, output=given.output, padding_idx=given.padding_idx)
        self.theta0 = self.layout.parameters_of(given.model)
        self.params0 = self.layout.unflatten(self.theta0)
        self._init_thread_views()

    def _init_thread_views(self) -> None:
        # ``functional_call`` swaps the given tensors into the module for the duration of the call: two threads
        # calling it on one module would read each other's weights (and could leave them swapped in). Each thread
        # calls its own structure copy instead (shared tensors, made on its first call); a model that cannot be
        # copied is called under a lock.
        self._views = threading.local()
        self._call_lock = threading.Lock()
        self._copyable: bool | None = None

    def _thread_module(self) -> nn.Module | None:
        """This thread's structure copy of ``module`` (None when the model cannot be deep-copied)."""
        view = getattr(self._views, "module", None)
        if view is None and self._copyable is not False:
            try:
                view = structure_copy(self.module)
            except Exception as err:  # noqa: BLE001 - any model deepcopy refuses: calls are serialised instead
                logger.debug("cannot copy %s (%s); its calls are serialised", type(self.module).__name__, err)
                self._copyable = False
                return None
            self._copyable = True
            self._views.module = view
        return view

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype."""
        return self.layout.dtype

    @property
    def device(self) -> torch.device:
        """The weights' device."""
        return self.layout.device

    @property
    def n_weights(self) -> int:
        """D, the number of trainable weights."""
        return self.layout.size

    def unflatten(self, theta: torch.Tensor) -> dict:
        """A flat weight vector of length D as a name → tensor dict for :meth:`__call__`."""
        return self.layout.unflatten(theta)

    def __call__(self, inputs, params: dict | None = None) -> torch.Tensor:
        """f(inputs; params): the model evaluated at ``params`` (a name → tensor dict; θ0 when None)."""
        params = self.params0 if params is None else params
        view = self._thread_module()
        if view is not None:
            out = self.adapter.call(view, params, inputs)
        else:
            with self._call_lock:
                out = self.adapter.call(self.module, params, inputs)
        if self.layout.param_dtypes is not None and out.is_floating_point() and out.dtype != self.dtype:
            out = out.to(self.dtype)  # mixed precisions: outputs in the weights' (widest) dtype
        return out

    def linear_taps(self, inputs, params: dict) -> tuple[torch.Tensor, list] | None:
        """f(inputs; params) and, for every ``nn.Linear`` layer whose weight is trainable, its input and output in
        that call (in call order): ``(out, [(weight name, bias name or None, input, output), ...])``.

        Forward hooks on this thread's structure copy of the model (never on the model itself), removed before
        returning. None when the taps cannot describe every trainable weight: a trainable weight outside an
        ``nn.Linear`` (or a frozen weight beside a trainable bias), a layer called more than once, a layer input
        that is not one vector per record, or a model that cannot be copied per thread."""
        view = self._thread_module()
        names = set(self.layout.names)
        if view is None:
            return None
        layers = {}
        for prefix, m in view.named_modules():
            if isinstance(m, nn.Linear):
                weight, bias = (f"{prefix}.{n}" if prefix else n for n in ("weight", "bias"))
                if weight in names:
                    layers[prefix] = (m, weight, bias if bias in names else None)
                elif bias in names:
                    return None
        covered = {n for _, w, b in layers.values() for n in (w, b) if n is not None}
        if covered != names:
            return None
        taps: list = []
        handles = [m.register_forward_hook(functools.partial(_tap, taps, w, b)) for m, w, b in layers.values()]
        try:
            out = self(inputs, params)
        finally:
            for h in handles:
                h.remove()
        rows = out.shape[0] if out.ndim else -1
        if len(taps) != len(layers) or any(a.ndim != 2 or a.shape[0] != rows for _, _, a, _ in taps):
            return None
        return out, taps

    def autodiff(self) -> contextlib.AbstractContextManager:
        """:func:`autodiff_context` for this model: gradients on, oneDNN off for recurrent layers on CPU."""
        return autodiff_context(self.module, self.device)

    def check_inputs(self, X, name: str = "X") -> torch.Tensor:
        """Check network inputs against the model: a non-empty, finite torch tensor with a leading record
        axis, on the model's device, and with the model's dtype when floating (integer inputs such as
        token ids pass as they are). Returns ``X`` unchanged; raises TypeError or ValueError naming ``name``."""
        if not isinstance(X, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}; convert with torch.as_tensor.")
        check_finite_tensor(name, X)
        if X.ndim < 1:
            raise ValueError(f"{name} must have a leading record axis, got a scalar.")
        if X.device != self.device:
            raise ValueError(f"{name} is on {X.device}, but the model lives on {self.device}; "
                             f"move it with .to('{self.device}').")
        if X.is_floating_point() and X.dtype != self.dtype:
            raise TypeError(f"{name} has dtype {X.dtype}, but the model's weights are {self.dtype}; "
                            f"convert it with .to({self.dtype}).")
        return X

    def output_shape(self, X: torch.Tensor, name: str = "X") -> tuple:
        """The per-record output shape f(x; θ0).shape[1:], from one forward pass on the first row of ``X``.

        Raises a ValueError naming the rows' shape when the model cannot be evaluated on them (wrong
        number of features, token ids out of range, ...), or when it does not return a tensor.
        """
        try:
            with torch.no_grad(), self.autodiff():
                out = self(X[:1])
        except (RuntimeError, TypeError, IndexError) as err:
            raise ValueError(
                f"The model {type(self.module).__name__} cannot be evaluated on {name}, whose rows have shape "
                f"{tuple(X.shape[1:])} and dtype {X.dtype}: {err}"
            ) from err
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"The model must return a torch.Tensor, got {type(out).__name__}.")
        return tuple(out.shape[1:])

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["params0"]  # views of θ0, rebuilt on loading (a plain pickle would store them as copies)
        for key in ("_views", "_call_lock", "_copyable"):  # per-thread copies and their lock, rebuilt on loading
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        # Unpickled with a map_location (e.g. a CUDA fit loaded on a CPU-only machine), the tensors may now
        # live elsewhere than the recorded device: follow the tensors.
        device = self.theta0.device
        if device != self.layout.device:
            self.layout = dataclasses.replace(self.layout, device=device)
        self.params0 = self.layout.unflatten(self.theta0)
        self._init_thread_views()

    def __repr__(self) -> str:
        return (f"FunctionalModel({type(self.module).__name__}, D={self.n_weights}, dtype={self.dtype}, "
                f"device={self.device})")


class BoundModel:
    """The per-record Jacobians and read-only views (layout, dtype, device, θ0) of ``functional_model`` (a
    :class:`FunctionalModel`), for the GGN operator and the posterior; each way of forming the Jacobians remembers
    whether the model allows it."""

    def __init__(self, functional_model: FunctionalModel) -> None:
        self.functional_model = functional_model
        self._vmap_jac_ok: bool | None = None  # None: not tried yet (likewise _pullback_jac_ok)

    @property
    def layout(self) -> ParameterLayout:
        return self.functional_model.layout

    @property
    def dtype(self) -> torch.dtype:
        return self.functional_model.dtype

    @property
    def device(self) -> torch.device:
        return self.functional_model.device

    @property
    def theta0(self) -> torch.Tensor:
        return self.functional_model.theta0

    def record_jacobians(self, Xb: torch.Tensor) -> torch.Tensor:
        """∂f(x_i)/∂θ at θ0 for every record of Xb, flattened over the weights: shape ``(c, *out, D)``.

        Reverse mode, vectorised over the records with ``torch.func.vmap`` where the model allows it (remembered
        in ``_vmap_jac_ok``); else (models whose forward branches on the data, as transformers' mask handling)
        one forward pass per group of records and its pullback vectorised over the group's outputs
        (:meth:`_pullback_jacobians`, checked once against the loop); a loop over records and outputs otherwise.
        """
        fm = self.functional_model
        layout = fm.layout

        def single(params, x):
            return fm(x.unsqueeze(0), params).squeeze(0)

        def flat(jac: dict, lead: int) -> torch.Tensor:
            return torch.cat([jac[n].reshape(*jac[n].shape[:lead], -1) for n in layout.names], -1)

        with fm.autodiff():
            if getattr(self, "_vmap_jac_ok", None) is not False:
                try:
                    jac = vmap(jacrev(single), in_dims=(None, 0))(fm.params0, Xb)
                    self._vmap_jac_ok = True
                    out_ndim = next(iter(jac.values())).ndim - len(layout.shapes[0]) - 1
                    return flat(jac, 1 + out_ndim).detach().to(layout.dtype)
                except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back
                    if getattr(self, "_vmap_jac_ok", None):
                        raise
                    logger.debug("vmap over per-record Jacobians failed (%s); pulling back per group", err)
                    self._vmap_jac_ok = False
            if getattr(self, "_pullback_jac_ok", None) is not False:
                try:
                    jac = self._pullback_jacobians(Xb)
                except Exception as err:  # noqa: BLE001 - a model the vectorised pullback cannot handle: the loop
                    if getattr(self, "_pullback_jac_ok", None):
                        raise
                    logger.debug("vectorised pullbacks failed (%s); computing Jacobians one by one", err)
                    self._pullback_jac_ok = False
                else:
                    if getattr(self, "_pullback_jac_ok", None) is None and Xb.shape[0] > 1:
                        # once: a record's output, computed beside another, must be its output alone
                        ref = self._loop_jacobians(Xb[:1])[0]
                        tol = 100 * torch.finfo(layout.dtype).eps * float(ref.abs().max().clamp_min(1e-30))
                        self._pullback_jac_ok = bool((jac[0] - ref).abs().max() <= tol)
                        if not self._pullback_jac_ok:
                            logger.debug("a record's output depends on other records; Jacobians one by one")
                    if getattr(self, "_pullback_jac_ok", None) is not False:
                        return jac
            return self._loop_jacobians(Xb)

    def _pullback_jacobians(self, Xb: torch.Tensor) -> torch.Tensor:
        """Per-record Jacobians from one forward pass per group of records and its pullback ``torch.func.vmap``-ed
        over the group's output basis (at most ``_PULLBACK_COTANGENTS`` at a time): exact when each record's
        output depends on its own input only (any network in eval mode that does not mix its rows)."""
        fm = self.functional_model
        layout = fm.layout

        def group_jacobians(xb: torch.Tensor) -> torch.Tensor:
            out, pull = vjp(lambda p: fm(xb, p), fm.params0)
            n = out.numel()
            basis = torch.eye(n, dtype=out.dtype, device=out.device).reshape(n, *out.shape)
            rows = []
            for j in range(0, n, _PULLBACK_COTANGENTS):
                (grads,) = vmap(pull)(basis[j:j + _PULLBACK_COTANGENTS])
                rows.append(torch.cat([grads[name].reshape(grads[name].shape[0], -1).to(layout.dtype)
                                       for name in layout.names], 1))
            return torch.cat(rows).reshape(*out.shape, -1).detach()

        first = min(2, Xb.shape[0])  # two records first: their number of outputs sizes the groups
        parts = [group_jacobians(Xb[:first])]
        group = max(1, _PULLBACK_COTANGENTS // math.prod(parts[0].shape[1:-1]))
        parts += [group_jacobians(Xb[i:i + group]) for i in range(first, Xb.shape[0], group)]
        return torch.cat(parts)

    def _loop_jacobians(self, Xb: torch.Tensor) -> torch.Tensor:
        """Per-record Jacobians by a loop over records and outputs (one backward pass each)."""
        fm = self.functional_model
        rows = []
        params = {n: p.detach().requires_grad_(True) for n, p in fm.params0.items()}
        for i in range(Xb.shape[0]):
            out = fm(Xb[i:i + 1], params)[0]
            flat_out = out.reshape(-1)
            grads = []
            for k in range(flat_out.shape[0]):
                g = torch.autograd.grad(flat_out[k], list(params.values()), retain_graph=True, allow_unused=True)
                grads.append(torch.cat([torch.zeros(p.numel(), dtype=fm.dtype, device=p.device) if gi is None
                                        else gi.reshape(-1).to(fm.dtype)
                                        for gi, p in zip(g, params.values(), strict=True)]))
            rows.append(torch.stack(grads).reshape(*out.shape, -1))
        return torch.stack(rows).detach()

    def record_jacobian_chunks(self, X: torch.Tensor, max_bytes: int,
                               batch_size: int | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
        """(rows, ∂f/∂θ of those rows in float64, shape ``(c, *out, D)``) over consecutive chunks of the records of X,
        each holding at most ``max_bytes`` of Jacobian entries (at least one record; at most ``batch_size``)."""
        n_out = math.prod(self.functional_model.output_shape(X))
        size = max(1, max_bytes // max(1, n_out * self.layout.size * 8))
        if batch_size is not None:
            size = min(size, batch_size)
        for i in range(0, X.shape[0], size):
            rows = slice(i, min(i + size, X.shape[0]))
            yield rows, self.record_jacobians(X[rows]).to(torch.float64)
