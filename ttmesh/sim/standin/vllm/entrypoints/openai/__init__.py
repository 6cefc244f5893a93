"""A stand-in package: ttmesh_standin serves in its place (ttmesh sim standin)."""
