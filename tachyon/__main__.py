"""`python -m tachyon ...`: the same as the `tachyon` command."""

from tachyon.cli import main

if __name__ == "__main__":
    main()
