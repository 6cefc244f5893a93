"""``python -m vllm.entrypoints.openai.api_server``: the stand-in (``ttmesh_standin``), not vLLM."""

from ttmesh_standin import main

if __name__ == "__main__":
    main("vllm")
