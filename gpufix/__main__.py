"""`python -m gpufix`."""

from gpufix.entry import main

if __name__ == "__main__":
    main()
