"""What machine a figure was measured on, told honestly (a Linux CPU is never "Apple Silicon")."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from localchat import __version__


@dataclass(frozen=True)
class Environment:
    python: str
    os: str
    machine: str
    chip: str
    apple_silicon: bool
    mlx_device: str
    metal_available: bool
    mlx_version: str | None
    mlx_lm_version: str | None
    localchat_version: str
    git_commit: str | None

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def hardware_label(self) -> str:
        """e.g. "Apple M2 Pro (Metal GPU)" or "AMD EPYC (CPU, Linux)"."""
        if self.apple_silicon and self.mlx_device == "gpu":
            return f"{self.chip} (Metal GPU)"
        return f"{self.chip} ({self.mlx_device.upper()}, {platform.system()})"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def chip_name() -> str:
    """The Apple chip name on a Mac (sysctl), the CPU model on Linux (/proc/cpuinfo)."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=2)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def mlx_device() -> tuple[str, bool]:
    """(default device type, Metal available); imports mlx, so only call when needed."""
    try:
        import mlx.core as mx
    except ImportError:
        return "unavailable", False
    device = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
    return device, bool(mx.metal.is_available())


def collect() -> Environment:
    device, metal = mlx_device()
    chip = chip_name()
    return Environment(
        python=platform.python_version(),
        os=f"{platform.system()} {platform.release()}",
        machine=platform.machine(),
        chip=chip,
        apple_silicon=sys.platform == "darwin" and platform.machine() == "arm64",
        mlx_device=device,
        metal_available=metal,
        mlx_version=_version("mlx"),
        mlx_lm_version=_version("mlx-lm"),
        localchat_version=__version__,
        git_commit=git_commit(),
    )


def conditions() -> dict:
    """What the machine was doing: its load average over a minute against its cores, and its
    thermal state where the OS gives it without privileges (macOS's ``pmset -g therm``)."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"load_1m": load, "cores": os.cpu_count(), "thermal": thermal_state()}


def thermal_state() -> str:
    """macOS: ``pmset -g therm``'s warning level or CPU speed limit; elsewhere, that none is given."""
    if sys.platform != "darwin":
        return "not given by this OS without privileges"
    try:
        out = subprocess.run(["pmset", "-g", "therm"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "pmset did not answer"
    said = [line.strip() for line in out.splitlines() if "=" in line or "warning" in line.lower()]
    return "; ".join(said)[:200] or "pmset gave nothing"


def busy(state: dict) -> bool:
    """Other work above half the cores: figures then run slower and noisier than the machine can.
    The run itself keeps one core busy (the load average counts it), so one is taken off first."""
    load, cores = state.get("load_1m"), state.get("cores")
    return load is not None and cores is not None and cores > 0 and load - 1 > cores / 2
