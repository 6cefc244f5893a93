"""The host memory a fleet needs, checked once before anything starts (issue 25).

A first start loads the model's weights into host memory and compiles for minutes: N replicas
started together hold N copies at once. The estimate is the size of the model's weight files
on disk (the local directory the profile's ``host_memory.model_flag`` names, ``--model-path``
for SGLang) times the profile's factors: ``starting`` (1.25 in the stock profiles:
tt-inference-server asks 2.5 GB of host RAM per billion parameters, the fp16 weights plus a
0.5x buffer, ``workflows/model_spec.py`` ``min_ram_gb``, and checks it against
``MemAvailable`` in ``workflows/setup_host.py``) for a replica that starts, ``serving`` (1.0:
its weights) for one that serves. Staggered (the default), the peak is one replica starting
while the others serve; ``--replicas-parallel``, every replica starting at once. It is
compared with ``MemAvailable`` of the host's ``/proc/meminfo`` (read through the host's
reader, so a simulated root's own file). Too little: refused (one line, exit 2); an estimate
that cannot be made (no local model directory, no MemAvailable): a note, never silence.

The weight files are only listed and stat'ed, never opened: a ``--model-path`` that is a FIFO
or ``/dev/zero`` is no directory, and only regular files count.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import plural

# The weight files SGLang's loader reads (DefaultModelLoader._prepare_weights, load format
# auto: the first of these patterns that matches any file in the model's directory).
WEIGHT_SUFFIXES = (".safetensors", ".bin")
MAX_ENTRIES = 10000  # a model directory holds tens of files: never list a huge tree
GIB = 1 << 30


@dataclass
class MemoryCheck:
    """What the fleet needs of the host's memory, and what it has (bytes)."""

    replicas: int
    parallel: bool
    starting: float
    serving: float
    model: str | None = None
    weights: int | None = None  # bytes of the model's weight files
    available: int | None = None  # MemAvailable
    source: str = ""  # the meminfo file read
    skipped: str | None = None  # why the memory was not checked

    def peak(self, replicas: int | None = None, parallel: bool | None = None) -> int | None:
        """The most the replicas hold at once: all starting, or one starting and the rest
        serving."""
        if self.weights is None:
            return None
        n = self.replicas if replicas is None else replicas
        together = self.parallel if parallel is None else parallel
        if together:
            return int(n * self.starting * self.weights)
        return int((self.starting + (n - 1) * self.serving) * self.weights)

    @property
    def fits(self) -> bool | None:
        peak = self.peak()
        if peak is None or self.available is None:
            return None
        return peak <= self.available

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.skipped is None and self.fits is not None,
            "skipped": self.skipped,
            "model": self.model,
            "weights_bytes": self.weights,
            "factors": {"starting": self.starting, "serving": self.serving},
            "start": "parallel" if self.parallel else "staggered",
            "peak_bytes": self.peak(),
            "available_bytes": self.available,
            "source": self.source,
            "fits": self.fits,
        }

    def says(self) -> str:
        """One clause for the plan: what is needed and what the host has."""
        if self.skipped is not None:
            return f"host memory not checked: {self.skipped}"
        peak, avail = self.peak(), self.available
        assert peak is not None and avail is not None
        return (
            f"host memory: {plural(self.replicas, 'replica')} of {self.model} "
            f"({gib(self.weights)} of weights) need about {gib(peak)} at their peak "
            f"({self._how()}); {gib(avail)} available (MemAvailable, {self.source})"
        )

    def _how(self) -> str:
        if self.parallel:
            return f"--replicas-parallel: every replica starting, {self.starting:g} x the weights"
        return (
            f"staggered: one starting at {self.starting:g} x the weights, "
            f"{self.replicas - 1} serving at {self.serving:g} x"
        )

    def refusal(self) -> TTMeshError:
        """One line: what the fleet needs, what the host has, and the ways out."""
        assert self.available is not None
        fixes = []
        most = max((k for k in range(1, self.replicas) if (self.peak(k) or 0) <= self.available),
                   default=0)  # fmt: skip
        if most >= 2:
            fixes.append(f"fewer replicas (--replicas {most} fits)")
        elif most == 1:
            fixes.append("one server (drop --replicas: one fits)")
        staggered = self.peak(parallel=False)
        if self.parallel and staggered is not None and staggered <= self.available:
            fixes.append(f"start them staggered (drop --replicas-parallel: {gib(staggered)})")
        fixes += ["free host memory", "or pass --no-memory-check"]
        return bad_input(self.says().replace("host memory: ", "not enough host memory: ", 1),
                         ", ".join(fixes))  # fmt: skip


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def weights_on_disk(path: str) -> tuple[int | None, str | None]:
    """(bytes of the weight files in directory ``path``, None) or (None, why not known).
    Stat only: nothing is opened, so a FIFO or a device never blocks the plan."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc} (a model id the server downloads has no " \
            "size here)"  # fmt: skip
    if not stat.S_ISDIR(st.st_mode):
        return None, f"{path} is not a directory of weight files"
    sizes: dict[str, int] = dict.fromkeys(WEIGHT_SUFFIXES, 0)
    found: dict[str, int] = dict.fromkeys(WEIGHT_SUFFIXES, 0)
    try:
        with os.scandir(path) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_ENTRIES:
                    return None, f"{path} holds more than {MAX_ENTRIES} entries"
                suffix = next((s for s in WEIGHT_SUFFIXES if entry.name.endswith(s)), None)
                if suffix is None:
                    continue
                try:
                    est = entry.stat()  # a link is followed (a Hugging Face snapshot's blobs)
                except OSError:
                    continue
                if stat.S_ISREG(est.st_mode):
                    sizes[suffix] += est.st_size
                    found[suffix] += 1
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    for suffix in WEIGHT_SUFFIXES:
        if found[suffix]:
            return sizes[suffix], None
    return None, f"{path} holds no *.safetensors or *.bin weight files"


def check(
    profile: Any, args: Any, base_dir: str, host: Any, replicas: int, parallel: bool
) -> MemoryCheck:
    """The fleet's memory, planned once from the profile, the command and the host."""
    from ttmesh.host import system

    spec = profile.extra.get("host_memory") or {}
    mc = MemoryCheck(replicas, parallel, float(spec.get("starting", 1.25)),
                     float(spec.get("serving", 1.0)))  # fmt: skip
    flag = spec.get("model_flag")
    if not flag:
        mc.skipped = f"profile {profile.name} says no host_memory.model_flag"
        return mc
    model = args.text(flag)
    if not model:
        mc.skipped = f"no {flag} given"
        return mc
    mc.model = model
    mc.weights, why = weights_on_disk(os.path.join(base_dir, model))
    if why is not None:
        mc.skipped = f"the size of {flag} is unknown: {why}"
        return mc
    mc.source = str(host.path(system.MEMINFO))
    try:
        info = system.meminfo(host)
    except TTMeshError as exc:
        mc.skipped = exc.message
        return mc
    if "MemAvailable" not in info:
        mc.skipped = f"{mc.source} has no MemAvailable"
        return mc
    mc.available = info["MemAvailable"] * 1024  # kB
    return mc
