"""Triton kernels and their host-side launchers; every module here imports triton.

The op modules in ``python_native_dsls.triton.ops`` import these lazily, from inside their impls, so that
registering the library never pays for importing triton.
"""

import os as _os

from python_native_dsls.triton import interpret_mode as _interpret_mode

# ``PYTHON_NATIVE_TRITON_INTERPRET=1`` puts the overrides at the CPU key; the kernels decorated
# below must then be Triton's interpreted functions too, even where ``TRITON_INTERPRET`` says
# otherwise (Triton reads it when each ``@triton.jit`` runs, i.e. when these modules import).
if _interpret_mode() and _os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("", "0", "false", "no", "off"):
    _os.environ["TRITON_INTERPRET"] = "1"
