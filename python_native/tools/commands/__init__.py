"""Subcommands of ``python -m python_native``: one module each (see ``python_native.__main__``).

A command module must stay cheap to import: ``HELP``, ``add_arguments`` and ``run`` import what
the command needs inside ``run``.
"""
