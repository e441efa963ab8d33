"""`python -m vit ...` is the `vit` command."""

from vit.commands import main

main()
