"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A problem with the user's input, data or environment; the message says what is wrong and how to fix it."""

    exit_code = 2
