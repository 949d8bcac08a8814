import os
import signal
import sys


def _stop_early(signum, frame) -> None:  # before the CLI is loaded nothing is stored: stop now, in one line
    os.write(2, b"autotune: interrupted; finished trials are stored, run the same command to resume\n")
    os._exit(130)


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_sig) is not signal.SIG_IGN:  # `nohup` and background jobs ignore some on purpose
        signal.signal(_sig, _stop_early)

from autotune.cli import main  # noqa: E402 - after the handlers: importing takes a second or two

sys.exit(main())
