"""How mpirun reaches the hosts of a job (``--hosts``, ``--launch-agent``, ``--tcp-interface``),
and one command run on each of them through one ``mpirun``."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.launcher.nodes import mpi


@dataclass
class MpiHosts:
    """How mpirun reaches the hosts of a job."""

    names: list[str]
    mpirun: str
    version: tuple[int, int] | None
    agent: str | None = None  # --launch-agent: mpirun's remote shell (instead of ssh)
    tcp_interface: str | None = None  # --tcp-interface
    environ: dict[str, str] = field(default_factory=dict)

    def args(self, hosts_of_ranks: list[str], rankfile: str) -> list[str]:
        """mpirun's options for ranks placed by ``rankfile`` (one line per rank)."""
        out: list[str] = []
        if self.agent:
            out += mpi.agent_args(self.version, self.agent)
        out += ["--host", mpi.host_slots(hosts_of_ranks)]
        out += mpi.rankfile_args(self.version, rankfile)
        out += mpi.tcp_args(self.tcp_interface, self.environ, self.version)
        if len(set(hosts_of_ranks)) < len(hosts_of_ranks):
            out.append("--oversubscribe")  # several ranks share slot 0 of a host (unbound)
        return out

    def run_each(
        self, command: list[str], timeout: float, what: str, env: tuple[str, ...] = ()
    ) -> tuple[subprocess.CompletedProcess[bytes], dict[tuple[int, str], bytes]]:
        """``command`` once on every host (copy N on host N, by a rankfile), through one mpirun;
        mpirun's result and what each copy printed, by (copy, stream) (mpirun's own words
        under copy -1). ``what`` names the wait in the line of a timeout ("report")."""
        with tempfile.TemporaryDirectory(prefix="ttmesh-hosts-") as tmp:
            Path(tmp, "rankfile").write_text(mpi.rankfile_text(self.names))
            argv = [self.mpirun, *self.args(self.names, "rankfile"), "-np", str(len(self.names))]
            argv.append("--tag-output")
            if os.geteuid() == 0:
                argv.append("--allow-run-as-root")
            for key in ("TTMESH_ROOT", "XDG_RUNTIME_DIR", "PYTHONPATH"):
                if key in self.environ:
                    argv += ["-x", key]
            for setting in env:
                argv += ["-x", setting]
            try:
                proc = subprocess.run(
                    [*argv, *command], cwd=tmp, capture_output=True, timeout=timeout
                )
            except subprocess.TimeoutExpired:
                raise bad_input(
                    f"the hosts did not {what} within {timeout:.0f} s ({', '.join(self.names)})",
                    "check that mpirun reaches them (ssh, or --launch-agent)",
                ) from None
            except OSError as exc:
                raise bad_input(f"cannot run {self.mpirun}: {exc.strerror}") from None
        chunks: dict[tuple[int, str], list[bytes]] = {}
        demux = mpi.Demux(
            lambda owner, name, data: chunks.setdefault((owner, name), []).append(data),
            self.version,
        )
        demux.data("stdout", proc.stdout)
        demux.data("stderr", proc.stderr)
        demux.flush()
        return proc, {key: b"".join(parts) for key, parts in chunks.items()}
