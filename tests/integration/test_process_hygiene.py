"""The integration suite's own hygiene: a process a test started under its tmp_path does
not outlive the test (``conftest._no_process_outlives_its_test``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.integration.conftest import _processes_under

pytestmark = pytest.mark.integration


def test_a_process_started_under_the_tests_folder_is_found_by_its_command_line(tmp_path):
    marker = tmp_path / "host.log"
    p = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)",
                          str(marker)])
    try:
        # Popen returns once the child has exec'd, but on a loaded machine (CI's two
        # xdist workers beside Spark) /proc may show the new command line a moment later:
        # CI once read [] here.  The fixture that uses this runs after a test, long after.
        deadline = time.monotonic() + 10
        while _processes_under(str(tmp_path) + "/") != [p.pid] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_under(str(tmp_path) + "/") == [p.pid]
        assert _processes_under(str(tmp_path) + "-other/") == []
    finally:
        p.kill()
        p.wait()
    assert _processes_under(str(tmp_path) + "/") == []
