import importlib.util
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
    """scripts/peers.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("peers", PEERS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pytest_addoption(parser):
    parser.addoption("--screenshot-dir", default=None,
                     help="write the headless-Chromium screenshots of the html, bring-up and history pages here "
                          "(default: a temporary folder)")
