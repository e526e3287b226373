"""The reliability suite (`regent chaos`, `make reliability`): the kernel's promises as runs.

Not part of the installed package: the product reaches it only through the `chaos` command, as it
reaches bench/ only through `bench`.
"""
