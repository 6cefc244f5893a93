"""Click commands kept outside ``ttmesh.cli`` (registered there with ``main.add_command``)."""
