"""`python -m dsv4_convert.cli`: the same as the `dsv4-convert` console script."""

from .main import main

if __name__ == "__main__":
    main()
