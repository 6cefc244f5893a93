"""Reset notices heard while an attempt's ranks run: another tool is about to reset the chips.

The guardian listens as tt-umd's listeners do (:mod:`ttmesh.host.umdnotice`) from the ranks'
start to the attempt's end. A PRE_RESET that concerns the job's chips, from a sender who could
reset them (:mod:`ttmesh.fabric.resetscope`), stops the job's ranks at once (the resetter waits
only its 2 s of grace, then resets whatever still runs): the attempt ends naming who reset,
and is not restarted (the chips are being reset under it; ``ttmesh check`` says when they are
back). A notice that does not concern the job is said once and the job goes on. What a notice
means for the job (:mod:`ttmesh.fabric.resetscope`) is imported when the first one comes: most
attempts hear none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ttmesh.host import umdnotice
from ttmesh.host.base import Host

if TYPE_CHECKING:
    from ttmesh.fabric.resetscope import Target

__all__ = ["ResetWatch"]


class ResetWatch:
    """The attempt's listener for reset notices, and what each means for the job.

    Anyone may send notices, as many as they like: what the watch says about the notices the
    job goes on after (another user's, other chips', a POST_RESET, every one with ``passing``)
    goes through :class:`umdnotice.Tally`, a few lines per sender's user and then one count
    per 10 s; the reason to stop is the only line said for certain."""

    def __init__(
        self,
        host: Host,
        bdfs: list[str],
        job_uid: int,
        say: Callable[[str], None],
        *,
        passing: bool = False,
    ) -> None:
        self.host = host
        self.job_uid = job_uid
        self.passing = passing  # --on-reset-notice pass: a heeded notice is said, not obeyed
        self.bdfs = bdfs
        self._chips: list[Target] | None = None  # read when a notice comes (rare)
        self.tally = umdnotice.Tally(say)
        self.listener, why = umdnotice.try_listen(host.root)
        if self.listener is None:
            say(f"not listening for tt-umd's reset notices: {why}")

    def fileno(self) -> int:
        assert self.listener is not None
        return self.listener.fileno()

    @property
    def listening(self) -> bool:
        return self.listener is not None

    def chips(self) -> list[Target]:
        """The job's PCI devices as the driver lists them, read at the first notice (a launch
        of 128 chips would otherwise read 128 sysfs links for a notice that may never come)."""
        if self._chips is None:
            from ttmesh.fabric import resetscope

            self._chips = resetscope.targets(self.host, self.bdfs)
        return self._chips

    def heard(self) -> str | None:
        """Read what arrived: the reason to stop the job, or None to go on."""
        if self.listener is None:
            return None
        stop = None
        for notice in self.listener.read():
            if notice.kind != "pre-reset":
                self.tally.line(
                    notice.uid, f"tt-umd reset notice: the reset by {notice.who()} is done"
                )
                continue
            from ttmesh.fabric import resetscope

            verdict = resetscope.judge(self.host, notice, self.chips(), self.job_uid)
            if not verdict.heed:
                self.tally.line(notice.uid, f"tt-umd reset notice: {verdict.why}: the job goes on")
            elif self.passing:
                self.tally.line(
                    notice.uid,
                    f"reset notice: {verdict.why}: the ranks go on (--on-reset-notice pass)",
                )
            elif stop is None:
                stop = f"reset notice: {verdict.why}"
        self.tick()
        return stop

    def tick(self) -> None:
        """Close connections past their deadline and say the counts that are due (called
        from the guardian's loop, which wakes at least every 50 ms while ranks run)."""
        if self.listener is None:
            return
        self.listener.expire()
        self.tally.dropped(self.listener.take_dropped())
        self.tally.tick()

    def close(self) -> None:
        if self.listener is not None:
            self.tally.dropped(self.listener.take_dropped())
            self.listener.close()
            self.listener = None
        self.tally.flush()
