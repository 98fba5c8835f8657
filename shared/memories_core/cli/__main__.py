"""``python -m memories_core.cli``: the same as the ``llm-memories`` console script."""

import sys

from memories_core.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
