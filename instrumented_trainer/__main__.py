"""Entry point: `python -m instrumented_trainer` (directly, with --nproc, or under torchrun)."""

import sys

from instrumented_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
