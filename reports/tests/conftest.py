import os
import sys

import pytest

# Run from a checkout without installing: the package lives next to this directory.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PEERS = os.path.join(os.path.dirname(ROOT), "scripts", "peers.py")


@pytest.fixture(scope="session")
def peers():
    """The package behind scripts/peers.py (flashbench_reports.peers), its API re-exported at the top."""
    import flashbench_reports.peers as mod
    return mod


def pytest_addoption(parser):
    parser.addoption("--screenshot-dir", default=None,
                     help="write the headless-Chromium screenshots of the html, bring-up and history pages here "
                          "(default: a temporary folder)")
