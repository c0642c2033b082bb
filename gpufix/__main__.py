"""`python -m gpufix`."""

from gpufix.cli import main

if __name__ == "__main__":
    main()
