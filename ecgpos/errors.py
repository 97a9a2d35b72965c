"""User-facing errors: each carries one line that the CLI prints without a traceback."""


class EcgposError(Exception):
    """An error caused by the user's input (a file, a flag, a config), not by a bug."""


class ConfigError(EcgposError):
    """A config file or override that does not map onto the config dataclasses."""


class SignalError(EcgposError):
    """A signal that cannot be preprocessed; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, ecgpos.cli) in a command that keeps work: the message says what was kept and how to go on."""
