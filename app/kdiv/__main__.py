"""`python -m kdiv`: the kdiv command."""

from kdiv.cli import main

main()
