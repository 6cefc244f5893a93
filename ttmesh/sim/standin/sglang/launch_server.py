"""``python -m sglang.launch_server``: the stand-in (``ttmesh_standin``), not SGLang."""

from ttmesh_standin import main

if __name__ == "__main__":
    main("sglang")
