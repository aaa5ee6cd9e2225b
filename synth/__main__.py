"""``python -m synth``: the same CLI as the ``synth`` command."""

import sys

from synth.cli import cli

if __name__ == "__main__":
    sys.exit(cli.main(prog_name="synth"))
