from ttmesh.cli import entry

entry()
