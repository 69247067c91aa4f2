"""Models that do not map one tensor of rows to one tensor of predictions, called as if they did.

glas-sklearn evaluates a network as ``f(X) -> Tensor``: the rows of ``X`` in, one prediction (or one row of
per-position predictions) per row out. Hugging Face ``transformers`` models, and ``peft`` models wrapping them,
take keyword inputs (``input_ids``, ``attention_mask``) and return a ``ModelOutput``, a dict or a tuple.
:class:`ModelAdapter` describes how to call such a model and which output to read; every consumer
(the GGN, the posterior, the estimators) reaches the model through one (``_functional.FunctionalModel``
builds it, with the defaults below, for any model it is given). The adapter holds the model itself, never a
copy, and never writes into it.

How a model is called (read once from the signature of its ``forward``, looking through wrappers whose
``forward`` takes only ``*args, **kwargs``, such as a ``peft.PeftModel``, to the model they wrap):

- a ``forward`` with an ``input_ids`` parameter gets the rows as ``input_ids=X``; any other gets them as the
  first positional argument;
- a ``forward`` with an ``attention_mask`` parameter also gets ``attention_mask = (X != pad).long()``, with
  ``pad`` the adapter's ``padding_idx``, or when that is None the model config's ``pad_token_id`` (no mask
  when both are None);
- a ``forward`` with a ``use_cache`` parameter gets ``use_cache=False`` (no key/value cache is kept for a pass
  that is not generation).

Which output is read: a tensor as it is; else ``output`` when given (a key or attribute name, a tuple index, or
a callable of the raw output); else the ``logits`` entry (``ModelOutput``, dict) or attribute, or the single
tensor of a one-element tuple. Anything else is refused with the entries it holds and how to name one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["ModelAdapter", "as_adapter", "unwrap_model"]

# How deep to look through forward(*args, **kwargs) wrappers for the signature of the model they wrap.
_MAX_WRAPPERS = 4
_INNER_ATTRIBUTES = ("base_model", "model", "module")


def _named_parameters_of_forward(model: nn.Module) -> set[str] | None:
    """The named parameters of ``model.forward`` (those a caller may pass by keyword), looking through wrappers
    whose forward takes only ``*args, **kwargs`` to the model they wrap; None when no level names any."""
    current = model
    for _ in range(_MAX_WRAPPERS):
        try:
            signature = inspect.signature(current.forward)
        except (TypeError, ValueError):
            return None
        named = {name for name, p in signature.parameters.items()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if named:
            return named
        inner = _wrapped_model(current)
        if inner is None:
            return None
        current = inner
    return None


def _wrapped_model(model: nn.Module) -> nn.Module | None:
    """The model a wrapper forwards to: peft's ``get_base_model()``, else a ``base_model``/``model``/``module``
    submodule (None when there is none)."""
    getter = getattr(model, "get_base_model", None)
    if callable(getter):
        try:
            inner = getter()
        except Exception:  # noqa: BLE001 - a wrapper without a base model: look at its attributes instead
            inner = None
        if isinstance(inner, nn.Module) and inner is not model:
            return inner
    for name in _INNER_ATTRIBUTES:
        inner = model._modules.get(name)
        if isinstance(inner, nn.Module):
            return inner
    return None


def _config_pad_token_id(model: nn.Module) -> int | None:
    """``config.pad_token_id`` of the model or of a model it wraps (None when there is no such config)."""
    current = model
    for _ in range(_MAX_WRAPPERS):
        config = current.__dict__.get("config")
        pad = getattr(config, "pad_token_id", None) if config is not None else None
        if isinstance(pad, int) and not isinstance(pad, bool):
            return pad
        current = _wrapped_model(current)
        if current is None:
            return None
    return None


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    return type(value).__name__


class ModelAdapter(nn.Module):
    """A model called the way glas-sklearn calls networks: one tensor of rows in, one tensor of predictions out.

    Wrap a model in one to name its output or its padding token; pass the adapter wherever a module goes
    (``module=`` of the estimators, :func:`~glas_sklearn.laplace.fit_laplace_subspace`). A model passed without
    one is adapted with the defaults (the module docstring says how it is called and which output is read).
    The posterior is over the *wrapped* model's trainable parameters, under its own parameter names
    (``adapter.model.named_parameters()``), so :func:`~glas_sklearn.sampling.sample_parameters` dicts go to
    ``torch.func.functional_call(adapter.model, params, ...)`` or, through :meth:`call`, to the adapter.

    Parameters
    ----------
    model : torch.nn.Module
        The model, held as it is (not copied).
    output : str, int or callable, optional
        The output to read: a key or attribute of a ``ModelOutput`` / dict (e.g. ``"start_logits"``), an index
        into a tuple, or a callable of the raw output returning a tensor. Default: the output itself when it
        is a tensor, else its ``logits``, else the one element of a one-element tuple.
    padding_idx : int, optional
        The token id of padding, for the ``attention_mask`` (default: the model config's ``pad_token_id``).

    Attributes
    ----------
    input_keyword : str or None
        "input_ids" when the rows go in by that keyword, None when positionally.
    passes_attention_mask : bool
        Whether the forward takes an ``attention_mask`` and a padding id is known (the adapter's or the config's).
    mask_token_id : int or None
        The padding id the mask is built from.

    Examples
    --------
    >>> import torch
    >>> class Keyword(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.emb = torch.nn.EmbeddingBag(10, 3, mode="sum")
    ...     def forward(self, input_ids=None, attention_mask=None):
    ...         return {"logits": self.emb(input_ids, per_sample_weights=attention_mask.float())}
    >>> net = Keyword()
    >>> adapter = ModelAdapter(net, padding_idx=0)
    >>> ids = torch.tensor([[3, 4, 0], [5, 0, 0]])
    >>> adapter.input_keyword, adapter.passes_attention_mask, adapter(ids).shape
    ('input_ids', True, torch.Size([2, 3]))
    >>> torch.equal(adapter(ids), net(input_ids=ids, attention_mask=(ids != 0).long())["logits"])
    True
    """

    def __init__(self, model: nn.Module, *, output: str | int | Callable | None = None,
                 padding_idx: int | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"ModelAdapter wraps a torch.nn.Module, got {type(model).__name__}.")
        if isinstance(model, ModelAdapter):
            raise TypeError("The model is already a ModelAdapter; pass its .model, or use as_adapter() to change "
                            "its settings.")
        if output is not None and not (isinstance(output, (str, int)) or callable(output)) or isinstance(output, bool):
            raise TypeError(f"output must be a key or attribute name, a tuple index or a callable, got {output!r}.")
        if padding_idx is not None and (isinstance(padding_idx, bool) or not isinstance(padding_idx, int)
                                        or padding_idx < 0):
            raise ValueError(f"padding_idx must be a non-negative token id or None, got {padding_idx!r}.")
        super().__init__()
        self.model = model
        self.output = output
        self.padding_idx = padding_idx
        named = _named_parameters_of_forward(model) or set()
        self.input_keyword = "input_ids" if "input_ids" in named else None
        self.mask_token_id = padding_idx if padding_idx is not None else _config_pad_token_id(model)
        self.passes_attention_mask = "attention_mask" in named and self.mask_token_id is not None
        self._no_cache = "use_cache" in named

    @property
    def is_trivial(self) -> bool:
        """Whether the model is called as ``model(X)`` with nothing added (its output still selected)."""
        return self.input_keyword is None and not self.passes_attention_mask and not self._no_cache

    def arguments(self, X: torch.Tensor) -> tuple[tuple, dict]:
        """The positional and keyword arguments of the model's forward for rows ``X``."""
        kwargs = {}
        if self.passes_attention_mask:
            kwargs["attention_mask"] = (X != self.mask_token_id).long()
        if self._no_cache:
            kwargs["use_cache"] = False
        if self.input_keyword is not None:
            kwargs[self.input_keyword] = X
            return (), kwargs
        return (X,), kwargs

    def select_output(self, out) -> torch.Tensor:
        """The prediction tensor in a raw model output (see the class docstring)."""
        if isinstance(out, torch.Tensor) and self.output is None:
            return out
        if self.output is not None:
            chosen = self._named_output(out)
        elif isinstance(out, Mapping) and "logits" in out:
            chosen = out["logits"]
        elif not isinstance(out, (Mapping, tuple, list)) and isinstance(getattr(out, "logits", None), torch.Tensor):
            chosen = out.logits
        elif isinstance(out, (tuple, list)) and len(out) == 1:
            chosen = out[0]
        else:
            raise ValueError(self._undetermined(out))
        if not isinstance(chosen, torch.Tensor):
            raise ValueError(f"The output {self.output!r} of {type(self.model).__name__} is a {_describe(chosen)}, "
                             "not a tensor of predictions; name another one with "
                             "ModelAdapter(model, output=...).")
        return chosen

    def _named_output(self, out):
        name = self.output
        if callable(name):
            return name(out)
        try:
            if isinstance(name, int):
                if not isinstance(out, (tuple, list)):
                    raise TypeError
                return out[name]
            if isinstance(out, Mapping):
                return out[name]
            return getattr(out, name)
        except (KeyError, IndexError, AttributeError, TypeError):
            raise ValueError(self._undetermined(out, missing=name)) from None

    def _undetermined(self, out, missing=None) -> str:
        model = type(self.model).__name__
        if isinstance(out, Mapping):
            entries = ", ".join(f"{k!r}: {_describe(v)}" for k, v in out.items())
            what, how = f"a {type(out).__name__} with keys {{{entries}}}", "a key, e.g. output='start_logits'"
        elif isinstance(out, (tuple, list)):
            entries = ", ".join(f"[{i}] {_describe(v)}" for i, v in enumerate(out))
            what, how = f"a {type(out).__name__} of {len(out)} items ({entries})", "an index, e.g. output=0"
        else:
            public = [k for k in vars(out) if not k.startswith("_")] if hasattr(out, "__dict__") else []
            what, how = f"a {type(out).__name__} (attributes {public})", "an attribute name"
        problem = f"has no output {missing!r}" if missing is not None else "has no 'logits' output"
        return (f"{model} returns {what}, which {problem}; name the prediction to use with "
                f"glas_sklearn.adapters.ModelAdapter({model.lower()}, output=...): {how}, or a callable of the "
                "raw output returning a tensor.")

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        args, kwargs = self.arguments(X)
        return self.select_output(self.model(*args, **kwargs))

    def call(self, module: nn.Module, params: dict, X: torch.Tensor) -> torch.Tensor:
        """The prediction of ``module`` (the wrapped model or a view of it sharing its structure) at the weights
        ``params`` (names of the wrapped model → tensors; the others keep the module's own), through
        ``torch.func.functional_call``: the module is never written into."""
        args, kwargs = self.arguments(X)
        return self.select_output(functional_call(module, params, args, kwargs))

    def extra_repr(self) -> str:
        parts = [f"input={self.input_keyword or 'positional'}"]
        if self.passes_attention_mask:
            parts.append(f"attention_mask from token {self.mask_token_id}")
        if self.output is not None:
            parts.append(f"output={self.output!r}")
        return ", ".join(parts)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model an adapter wraps (the model itself when it is not a :class:`ModelAdapter`)."""
    return model.model if isinstance(model, ModelAdapter) else model


def as_adapter(model: nn.Module, *, padding_idx: int | None = None) -> ModelAdapter:
    """``model`` as a :class:`ModelAdapter`: itself when it is one (a new adapter with ``padding_idx`` when it
    has none and one is given), else a new adapter with the defaults and ``padding_idx``."""
    if isinstance(model, ModelAdapter):
        if padding_idx is None or model.padding_idx is not None:
            return model
        return ModelAdapter(model.model, output=model.output, padding_idx=padding_idx)
    return ModelAdapter(model, padding_idx=padding_idx)
