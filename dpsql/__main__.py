"""``python -m dpsql``: the ``dpsql`` command line."""
import sys

if __name__ == "__main__":
    try:
        from dpsql.frontends.cli import main
    except KeyboardInterrupt:  # Ctrl-C while importing: nothing has run yet
        sys.exit(130)
    raise SystemExit(main())
