"""`python -m laminar` is the `laminar` command (the dev cluster starts nodes this way)."""

from laminar.cli import main

if __name__ == "__main__":
    main()
