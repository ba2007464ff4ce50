"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A problem with the user's input, data or environment; the message says what is wrong and how to fix it."""

    exit_code = 2


class StageFailed(UserError):
    """The stage ran but did nothing useful (e.g. every analyzer request failed): the run is marked failed, `latest`
    stays where it was, and the message says what to do; exit code 1."""

    exit_code = 1


class NonFiniteValue(UserError):
    """A loss or a weight became NaN or infinite while training: the run stops as failed with one line naming the
    step and the quantity, and exports nothing (no model, `latest` unchanged). `rows`: the metrics of the steps up to
    the one that failed, where the loop has them, for the failed run's metrics.jsonl."""

    def __init__(self, message: str, rows: list[dict] | None = None):
        super().__init__(message)
        self.rows = list(rows or [])


class EnvFault(UserError):
    """An environment's own code broke the protocol (a user's class: its reset or step raised, returned the wrong
    shape, a reward that is not a finite number): one line naming the class, the method, the task and the step, exit
    code 2; `detail` is the traceback, which the CLI writes to the run's log instead of the screen."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail
