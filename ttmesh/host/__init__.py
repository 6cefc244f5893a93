"""What a machine has, read through one interface (:class:`~ttmesh.host.base.Host`)."""

from ttmesh.host.base import Host

__all__ = ["Host"]
