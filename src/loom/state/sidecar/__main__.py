"""`python -m loom.state.sidecar ADDRESS CONFIG_JSON`: run a node's sidecar."""

import sys

from loom.state.sidecar.process import main

main(sys.argv[1:])
