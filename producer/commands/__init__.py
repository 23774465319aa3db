"""Command groups of `cosyq`, one module each (see producer/cli.py COMMANDS)."""
