"""scripts/registry.sh without a JVM: what it does with pid files it did not leave running.

Starting the registry itself is tests/integration/test_avro_registry.py's (Java, the lock)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "registry.sh"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def run(state: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "REGISTRY_STATE": str(state), **env}
    full.pop("SCHEMA_REGISTRY_URL", None)
    full.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=full, timeout=60)


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_status_of_a_dead_pid_file_says_stopped_and_removes_it(tmp_path):
    (tmp_path / "registry.pid").write_text(f"{dead_pid()}\n")
    r = run(tmp_path, "status")
    assert r.returncode == 3, r.stderr
    assert "stopped" in r.stdout
    assert not (tmp_path / "registry.pid").exists()


def test_stop_never_kills_a_process_that_is_not_the_registry(tmp_path):
    # A pid file whose pid was reused by another program: not ours to stop.
    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "registry.pid").write_text(f"{other.pid}\n")
        r = run(tmp_path, "stop")
        assert r.returncode == 0, r.stderr
        assert "not running" in r.stderr
        assert other.poll() is None
        assert not (tmp_path / "registry.pid").exists()
    finally:
        other.kill()
        other.wait()


def test_stop_with_nothing_running_is_a_no_op(tmp_path):
    r = run(tmp_path, "stop")
    assert r.returncode == 0
    assert "not running" in r.stderr


def test_unknown_command_is_a_usage_error(tmp_path):
    r = run(tmp_path, "restart")
    assert r.returncode == 2
    assert "usage:" in r.stderr


def test_a_taken_registry_port_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # java may be missing on a gate-only machine; the port check comes after it
        r = run(tmp_path, "start", REGISTRY_PORT=str(port), PATH=os.environ["PATH"])
    if "java" in r.stderr and "not found" in r.stderr:
        pytest.skip("no java on PATH")
    assert r.returncode != 0
    assert f"port {port} (REGISTRY_PORT) is already in use" in r.stderr
    assert not (tmp_path / "registry.pid").exists()


def test_an_answering_schema_registry_url_is_used_and_nothing_starts(tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Subjects(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            ok = self.path.endswith("/subjects")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"[]")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Subjects)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/apis/ccompat/v7"
        r = run(tmp_path, "start", SCHEMA_REGISTRY_URL=url)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [f"SCHEMA_REGISTRY_URL={url}"]
    assert "using the registry at SCHEMA_REGISTRY_URL" in r.stderr
    assert not (tmp_path / "registry.pid").exists()
