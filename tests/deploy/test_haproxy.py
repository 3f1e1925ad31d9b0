"""The shipped HAProxy configurations (deploy/haproxy/): ``haproxy -c`` accepts each
(with the environment its example file or placeholders give it), and the cells
front is consistent: every cell in the map has a backend, and every cell's routers
are in the starts backends under the same names.

``haproxy -c`` needs Debian's haproxy package (``make test`` installs it); without
it those checks skip, saying so. The consistency checks read the file and always run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.units import ROOT, read_env_file

HAPROXY_DIR = ROOT / "deploy" / "haproxy"
CONFIGS = sorted(HAPROXY_DIR.glob("*.cfg"))
CELLS = HAPROXY_DIR / "cells.cfg"
HAPROXY = shutil.which("haproxy")
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy not installed (apt-get install haproxy; make test does it)"
)


def _variables(config: Path) -> set[str]:
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)\}", config.read_text(encoding="utf-8")))


def _env_for(config: Path) -> dict[str, str]:
    """The example environment file next to ``config``, else loopback placeholders."""
    example = config.with_suffix(".env")
    if example.is_file():
        return read_env_file(example)
    return {name: f"127.0.0.1:{20000 + k}" for k, name in enumerate(sorted(_variables(config)))}


def _check(config: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert HAPROXY is not None
    return subprocess.run(
        [HAPROXY, "-c", "-f", str(config)],
        env={"PATH": "/usr/sbin:/usr/bin:/bin", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_cells_front_is_shipped() -> None:
    assert {CELLS, HAPROXY_DIR / "cells.map"} <= set(HAPROXY_DIR.iterdir())


@needs_haproxy
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_haproxy_accepts_the_shipped_configuration(config: Path, tmp_path: Path) -> None:
    # From another directory: the map is found relative to the file (default-path).
    done = _check(config, _env_for(config), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_haproxy
def test_haproxy_check_catches_a_broken_configuration(tmp_path: Path) -> None:
    """Guards the check above against passing vacuously."""
    broken = tmp_path / "cells.cfg"
    broken.write_text(
        CELLS.read_text().replace("use_backend be_starts_any", "use_backend be_nowhere")
    )
    shutil.copy(HAPROXY_DIR / "cells.map", tmp_path / "cells.map")
    shutil.copytree(HAPROXY_DIR / "errors", tmp_path / "errors")
    done = _check(broken, _env_for(CELLS), tmp_path)
    assert done.returncode != 0 and "be_nowhere" in done.stdout + done.stderr


def test_the_example_environment_fills_every_variable() -> None:
    env = read_env_file(HAPROXY_DIR / "cells.env")
    assert _variables(CELLS) <= set(env)


def _backends(text: str) -> dict[str, list[tuple[str, str]]]:
    """backend name -> [(server name, address)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["backend"]:
            current = words[1]
            out[current] = []
        elif words[:1] in (["frontend"], ["defaults"], ["global"]):
            current = None
        elif words[:1] == ["server"] and current is not None:
            out[current].append((words[1], words[2]))
    return out


def test_every_cell_has_a_backend_and_its_routers_take_starts() -> None:
    backends = _backends(CELLS.read_text())
    cells = {}
    for line in (HAPROXY_DIR / "cells.map").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, backend = line.split()
            cells[name] = backend
    assert len(cells) >= 2
    for name, backend in cells.items():
        routers = backends[backend]
        assert len(routers) == 2, f"cell {name}: a router pair"
        for starts in ("be_starts_room", "be_starts_any", "be_any_cell"):
            assert set(routers) <= set(backends[starts]), (name, starts)
    every = {s for b in cells.values() for s in backends[b]}
    for starts in ("be_starts_room", "be_starts_any", "be_any_cell"):
        assert set(backends[starts]) == every, f"{starts} lists a router of no cell"


@pytest.mark.parametrize("page", sorted((HAPROXY_DIR / "errors").glob("*.http")), ids=str)
def test_the_fronts_own_errors_are_openai_style(page: Path) -> None:
    """What the SDKs parse and retry on: the status, a JSON error body with a code,
    and Retry-After on the answers worth retrying."""
    import json

    head, _, body = page.read_bytes().partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert status == int(page.stem)
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body)["error"]["code"]
    assert ("Retry-After" in headers) == (status >= 500)


def test_only_the_front_sets_the_room_header() -> None:
    """A client's own X-Kairos-Require-Room is dropped before the starts backends
    add theirs (a start must never be declined because a client asked for it)."""
    text = CELLS.read_text()
    assert text.index("del-header X-Kairos-Require-Room") < text.index(
        "set-header X-Kairos-Require-Room"
    )
