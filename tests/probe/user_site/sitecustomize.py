"""A user's own sitecustomize: the probe's must still run it."""
import sys

MARK = "user-sitecustomize"
sys.stderr.write("user sitecustomize ran\n")
