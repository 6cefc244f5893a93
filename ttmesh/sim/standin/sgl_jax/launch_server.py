"""``python -m sgl_jax.launch_server``: the stand-in (``ttmesh_standin``), not SGLang-JAX."""

from ttmesh_standin import main

if __name__ == "__main__":
    main("sgl_jax")
