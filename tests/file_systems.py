"""File-system conditions for tests and the attack suite that hold for root too."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` made read-only for this process's user: permission bits, and for root
    (whom they do not stop) the immutable attribute."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
    else:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
