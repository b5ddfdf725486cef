"""Mutation epilogues: derive an op's in-place and ``out=`` forms from its functional kernel.

An op's *forms* are the overloads torch generates from one schema (torchgen's schema kinds): the
functional one, the in-place one (``add_.Tensor``) and the ``out=`` one (``add.out``). (A *variant*
is something else: one of an override's alternative impls, ``core.variants``.)

A DSL author writes ``add.Tensor`` once; the registry can route ``add_.Tensor`` and ``add.out``
to the same cond and impl, and the generated router finishes the job as aten would: copy into
``self`` or ``out`` (resizing ``out`` as aten does) and return the alias. Whenever the result could
not be written the way aten writes it (a broadcast that would grow ``self``, a dtype aten refuses
to cast to, an ``out`` of another dtype, another device), the router hands the call to aten's own
kernel, which does what aten does, raising exactly the error aten raises.
"""

from __future__ import annotations

import warnings

import torch

from python_native.foundations.schema import OpSignature, find_overload, qualify, signature_of

FORMS = ("inplace", "out")  # the forms an override can derive from its functional op


def fits_inplace(result: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether writing ``result`` into ``target`` is what aten's in-place kernel would do."""
    return (
        result.shape == target.shape
        and result.device == target.device
        and torch.can_cast(result.dtype, target.dtype)
    )


def fits_out(result: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``result`` can be written into ``out`` exactly as aten's out= kernel would (resizing it).

    Only an ``out`` of the result's own dtype qualifies: what aten does with another dtype depends
    on the op (``mul.out`` computes and casts, ``relu.out`` and ``gelu.out`` refuse), so any other
    goes to aten's kernel, which does exactly that.
    """
    return result.dtype == out.dtype and result.device == out.device


def write_out(result: torch.Tensor, out: torch.Tensor) -> None:
    """Resize ``out`` as aten's out= kernels do (warning when a non-empty one changes shape), then copy."""
    if out.shape != result.shape:
        if out.numel() != 0:
            warnings.warn(
                f"python_native: out= tensor of shape {list(out.shape)} was resized to {list(result.shape)}; "
                "resizing a non-empty out= tensor is deprecated in PyTorch, pass an empty one instead",
                UserWarning,
                stacklevel=2,
            )
        out.resize_(result.shape)
    out.copy_(result)


EPILOGUE_GLOBALS = {"_pn_fits": fits_inplace, "_pn_fits_out": fits_out, "_pn_write_out": write_out}


def _functional_params(sig: OpSignature) -> list[tuple[str, str, bool]]:
    return [(p.schema_name, "kw" if p.kwarg_only else "pos", p.has_default) for p in sig.params]


def _arg_types(lib_symbol: str, qualified: str) -> list[str]:
    overload = find_overload(lib_symbol, qualified)
    assert overload is not None
    return [str(a.type) for a in overload._schema.arguments]


def inplace_form(lib_symbol: str, functional: OpSignature) -> str | None:
    """``add.Tensor`` → ``add_.Tensor`` when that overload exists with the same arguments."""
    candidate = qualify(functional.packet + "_", functional.overload)
    if find_overload(lib_symbol, candidate) is None:
        return None
    sig = signature_of(lib_symbol, candidate)
    if not sig.params or not sig.params[0].mutable:
        return None
    if _functional_params(sig) != _functional_params(functional):
        return None
    if _arg_types(lib_symbol, candidate) != _arg_types(lib_symbol, functional.qualified):
        return None
    return candidate


def out_form(lib_symbol: str, functional: OpSignature) -> str | None:
    """The overload of the same op taking the functional's arguments plus keyword-only ``out``s."""
    packet = getattr(getattr(torch.ops, lib_symbol), functional.packet)
    want_params = _functional_params(functional)
    want_types = _arg_types(lib_symbol, functional.qualified)
    for overload_name in sorted(packet.overloads()):
        candidate = qualify(functional.packet, overload_name)
        if candidate == functional.qualified:
            continue
        sig = signature_of(lib_symbol, candidate)
        outs = [p for p in sig.params if p.is_out]
        if not outs or len(outs) != functional.n_returns:
            continue
        kept = [p for p in sig.params if not p.is_out]
        if [(p.schema_name, "kw" if p.kwarg_only else "pos", p.has_default) for p in kept] != want_params:
            continue
        types = _arg_types(lib_symbol, candidate)
        kept_types = [t for t, p in zip(types, sig.params, strict=True) if not p.is_out]
        if kept_types == want_types:
            return candidate
    return None


def find_form(lib_symbol: str, functional: OpSignature, kind: str) -> str | None:
    """The overload of ``functional``'s ``kind`` form (one of ``FORMS``), or None where the op has none."""
    if kind == "inplace":
        return inplace_form(lib_symbol, functional)
    return out_form(lib_symbol, functional)
