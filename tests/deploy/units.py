"""Read the shipped systemd units and example configs (paths, a small unit parser).

systemd's unit syntax is INI-like but repeats keys (``DeviceAllow=`` twice adds
two entries) and continues lines with a trailing backslash, which
``configparser`` does not model; this parser keeps every value in order.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
ETC = SYSTEMD / "etc" / "kairos"
DROPINS = SYSTEMD / "dropins"
INSTALL_PREFIX = "/opt/kairos/bin/"
CONFIG_DIR = "/etc/kairos/"

UNIT_FILES = sorted(SYSTEMD.glob("*.service"))
DROPIN_FILES = sorted(DROPINS.glob("*.conf"))


@dataclass
class Unit:
    """Sections → key → values (in file order)."""

    path: Path
    sections: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def get(self, section: str, key: str) -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def one(self, section: str, key: str) -> str:
        values = self.get(section, key)
        assert len(values) == 1, f"{self.path.name}: [{section}] {key}= set {len(values)} times"
        return values[0]

    def words(self, section: str, key: str) -> list[str]:
        """All space-separated words of every ``key=`` line (After=, Requires=, ...)."""
        return [w for v in self.get(section, key) for w in v.split()]


def parse_unit(path: Path) -> Unit:
    """Parse a unit or drop-in file; raise ValueError on lines systemd would reject."""
    unit = Unit(path)
    section: str | None = None
    pending = ""
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.sections.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None or not key.strip().isidentifier():
            raise ValueError(f"{path.name}:{lineno}: not a Key=Value line in a section: {raw!r}")
        unit.sections[section].setdefault(key.strip(), []).append(value.strip())
    if pending:
        raise ValueError(f"{path.name}: file ends in a line continuation")
    return unit


def exec_argv(command: str) -> list[str]:
    """``ExecStart=`` value → argv, without systemd's ``-@+!:`` prefixes."""
    argv = shlex.split(command)
    argv[0] = argv[0].lstrip("-@+!:")
    return argv


def config_flag(argv: list[str]) -> str | None:
    """The value of ``--config``/``-c`` in ``argv`` (``--config=X`` too)."""
    for i, word in enumerate(argv):
        if word in ("--config", "-c") and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--config="):
            return word.split("=", 1)[1]
    return None


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a systemd EnvironmentFile (comments and blanks skipped)."""
    env: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and key.isidentifier(), f"{path.name}: bad line {raw!r}"
        env[key] = value.strip().strip("\"'")
    return env


def etc_source(installed: str, instance: str) -> Path:
    """The shipped example for an installed path like ``/etc/kairos/kairosd-%i.toml``."""
    assert installed.startswith(CONFIG_DIR), installed
    return ETC / installed[len(CONFIG_DIR) :].replace("%i", instance)


def seconds(value: str) -> float:
    """systemd time span (``30s``, ``1min 30s``, ``500ms``, bare seconds) → seconds."""
    scale = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "": 1}
    total = 0.0
    for number, unit_name in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * scale[unit_name]
    return total
