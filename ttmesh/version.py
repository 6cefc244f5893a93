"""ttmesh's version, in a module of its own: every layer may read it without importing the
package's root (which offers the Python API, :mod:`ttmesh.launcher.api`, on first use)."""

__version__ = "0.1.0"
