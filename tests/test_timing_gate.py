"""The timing tests' noise gate sees other work on the machine: `OtherWork` counts a CPU burner
that runs beside the block, and not the block's own work or its waited-for children's."""
import subprocess
import sys
import time

import pytest

from conftest import OtherWork

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")


def test_a_burner_beside_the_block_is_other_work():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                          # past the interpreter's start
        with OtherWork() as w:
            time.sleep(1.0)
    finally:
        burner.kill()
        burner.wait()
    # one busy process of the machine's cores: at least a third of a core even beside two other
    # loads, as a share of all cores
    import os
    assert w.share is not None and w.share >= 0.33 / (os.cpu_count() or 1), w.share


def test_the_blocks_own_children_are_not_other_work():
    """A child that burns 1 s of CPU and is waited for inside the block counts as the block's own
    CPU (what OtherWork takes off the machine's busy time), whatever else the machine is doing."""
    own = OtherWork._own_s()
    with OtherWork():
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 1.0: pass"], check=True)
    assert OtherWork._own_s() - own >= 1.0
