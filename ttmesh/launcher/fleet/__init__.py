"""A serving fleet (``ttmesh launch --replicas N``): N servers on their own chips behind
SGLang's router, each recovered alone (docs/serving.md, "How a fleet works")."""
