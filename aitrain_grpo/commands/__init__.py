"""Entry points: the `aitrain` command line and the commands that are more than a flag parser."""
