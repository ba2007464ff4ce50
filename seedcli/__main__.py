"""`python -m seedcli` runs the `seed` command."""

from seedcli.cli import main

if __name__ == "__main__":
    main()
