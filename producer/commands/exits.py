"""The exit statuses of every `cosyq` command, and which error ends a command with which.

One table, so `cosyq result`, `say`, `stream` and `submit` mean the same by the same number:
0 done; 1 failed (a job failed, bad input lines, a refused request); 2 usage or settings error;
3 not done yet (the wait ended while the job was queued, running or waiting for a retry);
4 no such job (never submitted, or expired); 5 cannot tell now (Redis unreachable: try again);
6 the job was canceled (`cosyq cancel`, `DELETE /v1/jobs/{id}`): it has no result (`submit
--wait`: jobs were canceled and none failed);
141 the reader of stdout went away (128 + SIGPIPE, what `cat` exits with in `| head`): the
command ran to its end and would have exited 0 (shared/console.py).
"""

from __future__ import annotations

import redis

from shared.connection import is_outage, misconfiguration
from shared.console import EXIT_BROKEN_PIPE, point_stdout_at_devnull
from shared.errors import (
    CosyqError,
    InvalidJobIdError,
    JobCanceledError,
    JobNotFoundError,
    ResultTimeoutError,
    SettingsError,
    StreamTimeoutError,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_DONE = 3
EXIT_NOT_FOUND = 4
EXIT_UNAVAILABLE = 5
EXIT_CANCELED = 6


class UsageError(CosyqError):
    """A command line that cannot run as given (a bad job id, --out that does not fit): exit 2."""


def exit_status(error: BaseException) -> int:
    """The exit status for an error that ended a command (see the module docstring)."""
    if isinstance(error, SettingsError | UsageError | InvalidJobIdError):
        return EXIT_USAGE
    if isinstance(error, JobNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, JobCanceledError):
        return EXIT_CANCELED
    if isinstance(error, ResultTimeoutError | StreamTimeoutError):
        return EXIT_NOT_DONE
    if isinstance(error, redis.RedisError):
        if misconfiguration(error) is not None:
            return EXIT_USAGE
        if is_outage(error):
            return EXIT_UNAVAILABLE
    return EXIT_FAILED


def quiet_broken_pipe() -> int:
    """Stdout's reader closed it: point stdout at /dev/null so the interpreter's last flush
    does not print a traceback, and exit as a Unix filter killed by SIGPIPE would."""
    point_stdout_at_devnull()
    return EXIT_BROKEN_PIPE
