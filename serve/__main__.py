"""`python -m serve TARGET ...`: the same as `kern-serve`."""

from serve.cli import main

main()
