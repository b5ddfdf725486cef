"""Entry point torch calls during ``import torch`` (group ``torch.backends``).

It lives outside the ``python_native`` package so that no error there, not even one raised while
importing the package, can make ``import torch`` fail: everything is logged and swallowed.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` stops torch from calling it.
"""

import logging


def mount() -> None:
    try:
        import python_native  # noqa: F401  (importing mounts it at torch.backends.python_native)

        # Torch reads TORCH_LOGS right after this returns. When ``import python_native`` is what is
        # importing torch, the package above is only half-initialised: its log names are registered here.
        import python_native.foundations.logs  # noqa: F401
    except Exception:
        logging.getLogger("python_native").exception(
            "python_native could not be loaded; torch.backends.python_native is torch's own"
        )
