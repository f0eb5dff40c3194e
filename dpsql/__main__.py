"""``python -m dpsql``: the ``dpsql`` command line."""
from dpsql.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
