"""`python -m loom.runtime.emulate SPEC [--port N] [--time-scale S] ...`: one emulated engine."""

from loom.runtime.emulate.process import main

if __name__ == "__main__":
    main()
