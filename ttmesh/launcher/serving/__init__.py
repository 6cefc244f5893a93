"""Serving stacks: recognised from the command, started the way their makers intend.

A stack is a profile (``configs/profiles/*.yaml``): how it is recognised, its process model, how
chips are passed, the environment it needs, its flag rules, readiness, stop and leftovers.
A new stack is a new file, not new code (docs/serving.md).
"""
