"""Triton kernels and their host-side launchers; every module here but ``alloc`` and ``tuning``
imports triton (directly, or through the kernels it launches).

The op modules in ``python_native_dsls.triton.ops`` import these lazily, from inside their impls, so that
registering the library never pays for importing triton.
"""

import os as _os

from python_native.foundations import env as _env

from ..target import interpret_mode as _interpret_mode

# ``PYTHON_NATIVE_TRITON_INTERPRET=1`` puts the overrides at the CPU key; the kernels decorated
# below must then be Triton's interpreted functions too, even where ``TRITON_INTERPRET`` says
# otherwise (Triton reads it when each ``@triton.jit`` runs, i.e. when these modules import).
if _interpret_mode() and not _env.triton_runtime_interprets():
    _os.environ["TRITON_INTERPRET"] = "1"


def _interpreter_scalars_index_as_ints() -> None:
    """Let the interpreter's scalars serve where Python wants an int (``range`` bounds), on any numpy.

    Triton's interpreter holds each scalar as a one-element array; some releases (3.6 among them)
    turn it into an int with ``int(array)``, which numpy 2.4 and newer refuse for arrays that are not
    0-dimensional, so a loop such as ``for start in range(first, last, BLOCK_M)`` fails. Newer
    releases squeeze the array first; this makes older ones do the same, for the launches they
    patch ``triton.language`` for (the scope they restore afterwards).
    """
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "indexes_any_scalar", False) or not hasattr(interpreter, "_LangPatchScope"):
        return

    def patch_lang_tensor(tensor, scope, *args, **kwargs):
        patch(tensor, scope, *args, **kwargs)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.indexes_any_scalar = True
    interpreter._patch_lang_tensor = patch_lang_tensor


if _interpret_mode():
    _interpreter_scalars_index_as_ints()
