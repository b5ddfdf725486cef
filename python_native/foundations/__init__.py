"""Foundations: the pieces every layer above stands on (schemas, generated code, switches, traces,
environment, faults, logs, names). They import nothing of the package but each other."""
