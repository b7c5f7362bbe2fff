"""The ``laminar`` command (``python -m laminar`` too: the dev cluster starts nodes this way).

``laminar node start`` imports only what a node needs (``cli_node.py``); everything else goes
to the whole command tree in ``cli.py``."""

import sys


def main() -> None:
    if sys.argv[1:3] == ["node", "start"]:
        from laminar.cli_node import start_app

        start_app()(prog_name="laminar")
    else:
        from laminar.cli import app

        app(prog_name="laminar")


if __name__ == "__main__":
    main()
