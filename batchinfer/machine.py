"""How busy the machine was while something was timed: the CPU other processes took, and what the hypervisor
stole (psutil's CPU times: Linux's /proc/stat), against the cores there are. A rate measured on a busy machine
says little about a quiet night, so `plan` and the report say so. No batchinfer imports."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

# When batchinfer was first imported: the package imports this module first, so that start-up figures count
# from there. Not the process's start: a shell running `pip install ... && batchinfer run` may exec batchinfer in
# its own process, whose start (/proc/self/stat) is the shell's, before the install.
IMPORTED = time.monotonic()
BUSY_CORES = 0.25  # other processes' share of the cores (in cores) from which a measurement is flagged
# Two loads are comparable when the slowdowns they imply are within this factor of each other: a rate measured under
# one stands for the other (a loaded 2-core machine timed torch at 1,157 tokens/s, quiet it ran 4,226: 3.7x apart).
COMPARABLE = 1.5


def _cpu_seconds() -> dict[str, float]:
    """The machine's CPU time by kind since boot, in seconds (steal, irq and softirq where the OS counts them)."""
    return psutil.cpu_times()._asdict()


def process_age() -> float:
    """Seconds since batchinfer was first imported in this process: its imports, torch's included, but not the
    interpreter's own start (tens of milliseconds)."""
    return time.monotonic() - IMPORTED


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Load:
    """Over a window of `seconds`: cores busy with other processes, cores stolen, cores there are."""

    seconds: float
    others: float
    steal: float
    cores: int
    load_avg: float

    def slowdown(self) -> float:
        """How much longer work may take than on a quiet machine: all cores / the cores left to it."""
        taken = self.others + self.steal
        return self.cores / max(self.cores - taken, 0.5)

    def busy(self) -> bool:
        return self.others + self.steal >= BUSY_CORES

    def comparable(self, other: Load) -> bool:
        """Whether what was timed under one load stands for the other (COMPARABLE)."""
        a, b = self.slowdown(), other.slowdown()
        return max(a, b) / min(a, b) <= COMPARABLE

    def describe(self) -> str:
        """One clause: what took the machine, e.g. 'other processes used 1.3 of 2 cores (load average 3.1)'."""
        parts = []
        if self.others >= 0.05:
            parts.append(f"other processes used {self.others:.1f} of {self.cores} cores")
        if self.steal >= 0.05:
            parts.append(f"the hypervisor stole {self.steal:.1f} of {self.cores} cores")
        return " and ".join(parts or ["the machine was quiet"]) + f" (load average {self.load_avg:.1f})"

    def as_dict(self) -> dict:
        return {
            "cores": self.cores,
            "other_cores": round(self.others, 2),
            "steal_cores": round(self.steal, 2),
            "load_avg": round(self.load_avg, 2),
        }

    @classmethod
    def from_dict(cls, value) -> Load | None:
        """A Load as as_dict() saved it (in _report.json); None for anything else."""
        if not isinstance(value, dict):
            return None
        try:
            others, steal = float(value["other_cores"]), float(value["steal_cores"])
            return cls(0.0, others, steal, int(value["cores"]), float(value.get("load_avg", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None


class LoadWindow:
    """Started when made; stop() gives the Load since then (None where no time has passed)."""

    def __init__(self):
        self._cpu, self._own, self._t0 = _cpu_seconds(), _own_cpu(), time.monotonic()

    def stop(self) -> Load | None:
        cpu, wall = _cpu_seconds(), time.monotonic() - self._t0
        if wall <= 0:
            return None
        delta = {k: cpu[k] - self._cpu[k] for k in cpu}
        busy = sum(delta.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        own = _own_cpu() - self._own
        return Load(
            wall,
            max(busy - own, 0.0) / wall,
            delta.get("steal", 0.0) / wall,
            os.cpu_count() or 1,
            os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
        )


_SINCE_IMPORT = LoadWindow()


def load_so_far() -> Load | None:
    """The machine's load since batchinfer was imported in this process: what this run has met before it times
    anything (a cached measurement is weighed against it)."""
    return _SINCE_IMPORT.stop()
