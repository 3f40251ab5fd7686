import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REAL_FOLDERS = sorted(d for d in os.listdir(DATA) if os.path.isdir(os.path.join(DATA, d)))


@pytest.fixture(params=REAL_FOLDERS)
def real_folder(request):
    return os.path.join(DATA, request.param)
